"""Issue 26: the composed pipeline's figures (``python -m benchmarks --only compose``).

- resume cost against the number of sources (1, 10, 100, 1000): a fresh sampler loads a state saved in the middle
  of a 10^9-draw epoch and yields its first batch of 256, for a mixture resumed as it was saved (three schedule
  changes at (epoch, position) keys before the state), for a mixture changed at the resume (``on_change="continue"``,
  other weights and a source appended), for a later state of that changed run, and for sources of 5-15 records,
  each ~10^7 passes deep (a batch spans a source-epoch a draw); and a ``MixedStream`` of as many
  ``ShardedStream``s, beside one of them resumed alone. Each system is a *builder* (``BUILDERS``).
- state sizes: the sampler's whole state with a ``Mixture`` of 1 and 100 sources after 10 changes at resumes, and
  ``PackedRows`` over a ``Mixture`` (split and whole rows).

Each case runs in a fresh interpreter (``python -m benchmarks.cases_compose CASE JSON``), so its peak RSS is its own
(``benchmarks/isolated.py``); ``--smoke`` runs them in this process at small sizes.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks import isolated
from benchmarks.cases_compose_packing import figure as packing_epoch_start

if TYPE_CHECKING:
    from benchmarks.figures import Mode

BATCH = 256
EPOCH = 10**9  # draws in a mixture epoch
SAVED_AT = EPOCH // 2 + 999_937  # the saved position: mid-epoch, and deep inside a quota period of 10^6


@dataclass(frozen=True)
class Resume:
    """One way to resume: ``make()`` builds the object a resumed run builds (a sampler, a stream), which then loads
    ``state`` and yields its first batch of ``BATCH`` items. What ``make`` closes over (a built ``Mixture``, opened
    sources) is built once, outside the timing, as a run builds it before its loop; the timing is what a resume
    adds."""

    make: Callable[[], Any]
    state: dict[str, Any]


Builder = Callable[[int, bool], dict[str, Resume]]  # (number of sources, small) -> the builder's resumes, by name


def mixture_resumes(sources: int, small: bool) -> dict[str, Resume]:
    """A ``Mixture`` of ``sources`` sources (10^5 .. 10^7 records, random float weights, so quota periods of 10^6;
    ``small``: 10^3 .. 10^4 records and weights 1 .. 9, set up in milliseconds for ``--smoke``) through
    ``StatefulSampler``: as saved, changed at the resume, a later state of the changed run, and a mixture of tiny
    sources whose first batch after the resume spans hundreds of source-epochs."""
    from stateful_sampler import Mixture, StatefulSampler

    rng = np.random.default_rng(0)
    sizes = rng.integers(10**3, 10**4, sources) if small else rng.integers(10**5, 10**7, sources)
    added = int(sizes[0])  # the size of the source appended at the resume
    weights = lambda count: (rng.integers(1, 10, count) if small else rng.random(count) + 0.01).tolist()
    schedule = {(0, EPOCH * k // 8): weights(sources) for k in (1, 2, 3)}  # three changes before the saved position
    saved = Mixture(sizes.tolist(), weights(sources), num_samples=EPOCH, schedule=schedule)
    changed = Mixture([*sizes.tolist(), added], weights(sources + 1), num_samples=EPOCH, on_change="continue")
    total = int(sizes.sum())
    state = StatefulSampler(total, strategy=saved, seed=7, batch_size=BATCH).state_after(SAVED_AT // BATCH)
    live = StatefulSampler(total + added, strategy=changed, seed=7, batch_size=BATCH)
    live.load_state_dict(state)
    later = live.state_after(10**6 // BATCH)
    tiny = rng.integers(5, 16, sources).tolist()  # sources of 5-15 records: ~10^7 passes each by the saved position
    wrapping = Mixture(tiny, rng.integers(1, 10, sources).tolist(), num_samples=EPOCH)
    deep = StatefulSampler(sum(tiny), strategy=wrapping, seed=7, batch_size=BATCH).state_after(SAVED_AT // BATCH)
    return {
        "as saved (3 schedule changes before)": Resume(
            lambda: StatefulSampler(total, strategy=saved, seed=7, batch_size=BATCH), state
        ),
        "changed at the resume (+1 source)": Resume(
            lambda: StatefulSampler(total + added, strategy=changed, seed=7, batch_size=BATCH), state
        ),
        "a later state of the changed run": Resume(
            lambda: StatefulSampler(total + added, strategy=changed, seed=7, batch_size=BATCH), later
        ),
        "sources of 5-15 records, deep in their passes": Resume(
            lambda: StatefulSampler(sum(tiny), strategy=wrapping, seed=7, batch_size=BATCH), deep
        ),
    }


class MemoryShards:
    """A reader of shards held in memory (row r of shard s is ``(s, r)``), with ``read_rows``: the reads cost
    next to nothing, so a stream's figure is what its order and its reads' bookkeeping cost."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def count(self, shard: str) -> int:
        return self.rows

    def read(self, shard: str, start: int, stop: int) -> list[tuple[str, int]]:
        return [(shard, row) for row in range(start, stop)]

    def read_rows(self, shard: str, rows: Any) -> list[tuple[str, int]]:
        return [(shard, row) for row in np.asarray(rows).tolist()]


MIXED_REFERENCE = "one ShardedStream of a source's shards (the reference)"


def mixed_stream_resumes(sources: int, small: bool) -> dict[str, Resume]:
    """A ``MixedStream`` of ``sources`` ``ShardedStream``s (16 shards of 10^4 records each, window 8; ``small``: 4
    shards of 10^3) at weights 1 .. sources, saved mid-epoch of 10^9 draws, and beside it one of its sources alone
    resumed mid-epoch: issue 26 bounds the mixed stream's resume by twice that one stream's."""
    from stateful_sampler.stream import MixedStream, ShardedStream

    shards, rows = (4, 10**3) if small else (16, 10**4)

    def source(index: int) -> ShardedStream:
        names = [f"{index}-{shard}" for shard in range(shards)]
        return ShardedStream(names, MemoryShards(rows), batch_size=BATCH, window=8, seed=index)

    streams = [source(index) for index in range(sources)]
    weights = list(range(1, sources + 1))
    mixed = lambda: MixedStream(streams, weights, batch_size=BATCH, num_samples=EPOCH)
    return {
        "MixedStream, as saved": Resume(mixed, mixed().state_at(0, SAVED_AT)),
        MIXED_REFERENCE: Resume(lambda: source(0), source(0).state_at(3, shards * rows // 2 + rows // 3)),
    }


# The systems of the resume figure, each a builder of its resumes by name; their rows sit side by side.
BUILDERS: dict[str, Builder] = {"Mixture": mixture_resumes, "MixedStream": mixed_stream_resumes}


def resume_cost(builder: Builder, sources: int, repeats: int, small: bool = False) -> dict[str, Any]:
    """Each of the builder's resumes: build, load the state, first batch of ``BATCH``, ``repeats`` times (ms: the best,
    and the first, which pays the process's first calls), with the builder's own set-up time and the state's pickled
    size."""
    started = perf_counter()
    resumes = builder(sources, small)
    result: dict[str, Any] = {"setup_seconds": perf_counter() - started, "ms": {}, "first_ms": {}, "state_bytes": {}}
    for name, resume in resumes.items():
        times = []
        for _ in range(repeats):
            started = perf_counter()
            resumed = resume.make()
            resumed.load_state_dict(resume.state)
            first = list(islice(iter(resumed), BATCH))
            times.append(perf_counter() - started)
            assert len(first) == BATCH
        result["ms"][name], result["first_ms"][name] = min(times) * 1e3, times[0] * 1e3
        result["state_bytes"][name] = len(pickle.dumps(resume.state))
    return result


def resume_case(system: str, sources: int, repeats: int, small: bool) -> dict[str, Any]:
    return resume_cost(BUILDERS[system], sources, repeats, small)


def mixture_state(sources: int, changes: int) -> dict[str, Any]:
    """The sampler's whole state (8 ranks, batch 64) after ``changes`` changes of a ``Mixture`` of ``sources``
    sources at resumes (``on_change="continue"``, new integer weights each time, 10^7 draws apart): pickled bytes
    (what ``torch.save`` writes) and JSON bytes."""
    from stateful_sampler import Mixture, StatefulSampler

    sizes = (np.arange(sources) * 7919 % 9_000_000 + 1_000_000).tolist()
    rng = np.random.default_rng(0)
    state: dict[str, Any] = {"position": 0}
    for change in range(changes + 1):
        mixture = Mixture(sizes, rng.integers(1, 1000, sources).tolist(), num_samples=2 * 10**8, on_change="continue")
        live = StatefulSampler(sum(sizes), strategy=mixture, batch_size=64, num_replicas=8, rank=0)
        if change:
            live.load_state_dict(state)
        state = live.state_after(((change + 1) * 10**7 - state["position"]) // 8)
    return {"pickle_bytes": len(pickle.dumps(state)), "json_bytes": len(json.dumps(state))}


def packed_state(sources: int, split: bool) -> dict[str, Any]:
    """``PackedRows`` (rows of 2048, batches of 8) over a ``Mixture`` of ``sources`` sources of 10^3 records with a
    schedule change at (0, N/2): the state saved in the middle of epoch 0, pickled and as JSON."""
    from stateful_sampler import Mixture, PackedRows

    sizes = [1000] * sources
    lengths = np.clip(np.random.default_rng(1).lognormal(5.0, 1.0, sum(sizes)), 1, 2048).astype(np.int64)
    weights = np.arange(1, sources + 1)
    mixture = Mixture(sizes, weights, num_samples=sum(sizes), schedule={(0, sum(sizes) // 2): weights[::-1]})
    rows = PackedRows(lengths, 2048, split_records=split, strategy=mixture, seed=3, batch_size=8)
    state = rows.state_after(rows.rows_in_epoch(0) // 16)
    return {"pickle_bytes": len(pickle.dumps(state)), "json_bytes": len(json.dumps(state))}


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    "resume": resume_case, "mixture_state": mixture_state, "packed_state": packed_state,
}  # fmt: skip


def run(name: str, **params: Any) -> dict[str, Any]:
    return isolated.run("benchmarks.cases_compose", name, params)


def figure(mode: Mode, run_case: Any, figures: Any) -> None:
    """The figure: resume cost against the number of sources, and state sizes (``python -m benchmarks --only
    compose``)."""
    from benchmarks.figures import Check, Row

    name = f"compose: resume (build + load a state mid-epoch of 10^9 draws + first batch of {BATCH}) against sources"
    for sources in mode.pick(quick=(1, 10, 100, 1000), smoke=(1, 10, 100)):
        for system in BUILDERS:
            params = {"system": system, "sources": sources, "repeats": mode.pick(quick=7, smoke=2), "small": mode.smoke}
            result = run("resume", **params)
            for variant, ms in result["ms"].items():
                note = (f"first {result['first_ms'][variant]:.2f} ms; {result['state_bytes'][variant]} B state; "
                        f"set-up {result['setup_seconds']:.2f} s, once")  # fmt: skip
                figures.rows.append(Row(name, f"{sources} sources, {variant}", f"ours: {system}", ms, "ms",
                                        result["peak_mib_above_baseline"], note))  # fmt: skip
                if system == "Mixture" and sources == 1000:
                    figures.checks.append(Check(f"Mixture of 1000 sources, {variant}: resume ≤ 10 ms", f"{ms:.2f} ms",
                                                ms <= 10))  # fmt: skip
            if system == "MixedStream" and sources == 100:
                ratio = result["ms"]["MixedStream, as saved"] / result["ms"][MIXED_REFERENCE]
                figures.checks.append(Check("MixedStream of 100 sources: resume ≤ 2× one ShardedStream's",
                                            f"{ratio:.1f}×", ratio <= 2))  # fmt: skip
    name = "compose: state size (pickled, as torch.save writes it; JSON in the note)"
    for sources in (1, 100):
        size = run("mixture_state", sources=sources, changes=10)
        figures.rows.append(Row(name, f"sampler, Mixture of {sources} sources, after 10 changes", "ours",
                                size["pickle_bytes"], "B", note=f"JSON {size['json_bytes']} B"))  # fmt: skip
        if sources == 100:
            figures.checks.append(Check("state of a Mixture of 100 sources after 10 changes < 1 KB",
                                        f"{size['pickle_bytes']} B", size["pickle_bytes"] < 1024))  # fmt: skip
    for sources in (1, 100):
        for split in (True, False):
            size = run("packed_state", sources=sources, split=split)
            rows = "split" if split else "whole"
            figures.rows.append(Row(name, f"PackedRows ({rows}) over a Mixture of {sources} sources", "ours",
                                    size["pickle_bytes"], "B", note=f"JSON {size['json_bytes']} B"))  # fmt: skip
    packing_epoch_start(mode, run_case, figures)  # whole-record packing's epoch start, issue 26 item 5


if __name__ == "__main__":
    isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
