"""Issue 26's matrix: {map-style, stream} x {uniform, weighted, mixture changed mid-epoch, mixture changed at the
resume with a source appended} x {fixed batches, packed split, packed whole, token budget}.

For every supported cell, a state saved mid-epoch resumes at the same topology with the uninterrupted run's batches
step by step (and a later checkpoint of the resumed run resumes exactly too), and at W 4->3, 3->4 and half the
per-rank batch (ranks simulated in one process) with every unconsumed record, every token for packed rows, exactly
once, nothing consumed again, in equal steps on every rank. The cells that are not supported are listed in
``REFUSED`` with the exact error they raise, and a batching a source does not have in ``UNBUILT``. One real SIGKILL
(slow) covers the map-style row's four batchings at once: run in lockstep with 2 workers by ``matrix_kill_run.py``,
killed mid-epoch, resumed with 0 workers. The stream row's real SIGKILLs are its pieces' (tests/stream:
``MixedStream`` fixed batches, ``PackedStream`` split and whole-record rows) and examples/pretrain_mixture.py's (packed rows of a
``MixedStream`` with a schedule change, under verify: tests/docs/test_examples.py).

A *source* builds what a cell runs: ``MapStyle``, a ``StatefulSampler`` or a packed sampler over a strategy of
map-style datasets; ``Streamed``, a ``ShardedStream`` (uniform) or a ``MixedStream`` (weighted and the mixtures) of
tiny in-memory shards and one map-style corpus, batched by the stream itself or packed by ``PackedStream``. Both
number a record by its place in the sources concatenated, so one table of lengths serves both rows.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stateful_sampler import (
    IncompatibleStateError,
    Mixture,
    PackedRows,
    StatefulSampler,
    TokenBudgetBatches,
    Uniform,
    Weighted,
)
from stateful_sampler.stream import MixedStream, PackedStream, ShardedStream
from tests.compose.matrix_kill_run import loaders

SEED = 11
SIZES = [14, 22, 10]  # the saved run's sources
APPENDED = 8  # the source appended at the resume ("continue")
NUM_SAMPLES = 60  # a mixture epoch
CHANGE = (0, 30)  # the schedule key of "mixture changed mid-epoch": after the saved step, inside the epoch
LATER = 3  # steps of the resumed run before its own checkpoint: 4 of 3 ranks in all, in or past CHANGE's window
SEQ_LEN, WINDOW, MAX_TOKENS = 16, 7, 40
LENGTHS = np.random.default_rng(3).integers(1, SEQ_LEN + 1, sum(SIZES) + APPENDED).tolist()

ORDERS = ("uniform", "weighted", "mixture-schedule", "mixture-continue")
BATCHINGS = ("fixed", "packed-split", "packed-whole", "token-budget")
PER_RANK_BATCH = {"fixed": 4, "packed-split": 2, "packed-whole": 2, "token-budget": 1}  # items a rank takes a step
# (saving world, its per-rank batch as a fraction of the batching's, resuming world, its fraction)
TOPOLOGIES = {"4->3": (4, 1, 3, 1), "3->4": (3, 1, 4, 1), "half-batch": (4, 1, 4, 0.5)}
SAME_WORLD = 3  # the same topology: 3 ranks of the batching's per-rank batch, before and after


def _strategy(order: str, resumed: bool) -> Any:
    """The cell's strategy in the saving run, or (``resumed``) in the run that loads its state."""
    n = sum(SIZES)
    if order == "uniform":
        return Uniform()
    if order == "weighted":
        return Weighted(np.arange(n) % 5 + 1, num_samples=n + 9)
    if order == "mixture-schedule":
        return Mixture(SIZES, [3, 1, 2], num_samples=NUM_SAMPLES, schedule={CHANGE: [1, 3, 1], 1: [1, 1, 1]})
    if not resumed:
        return Mixture(SIZES, [3, 1, 2], num_samples=NUM_SAMPLES)
    return Mixture([*SIZES, APPENDED], [1, 2, 0, 3], num_samples=NUM_SAMPLES, on_change="continue")


@dataclass(frozen=True)
class Unit:
    """What a yielded item is, whatever built it: its id in the epoch (a position or a row), what it holds (a record,
    or the record slices of a row or batch) and whether it only evens out the ranks."""

    epoch: int
    id: int
    content: Any
    is_padding: bool


class MapStyle:
    """Map-style sources: the records of ``ConcatDataset(sources)``, ordered by the cell's strategy and batched by a
    ``StatefulSampler`` (fixed batches, keyed) or packed by ``PackedRows`` / ``TokenBudgetBatches``."""

    name = "map-style"

    def build(self, order: str, batching: str, *, resumed: bool, world: int, rank: int, fraction: float = 1) -> Any:
        strategy = _strategy(order, resumed)
        n = sum(SIZES) + (APPENDED if resumed and order == "mixture-continue" else 0)
        lengths = LENGTHS[:n]
        ranks = {"num_replicas": world, "rank": rank, "seed": SEED}
        batch = int(PER_RANK_BATCH[batching] * fraction)
        if batching == "fixed":
            return StatefulSampler(n, strategy=strategy, batch_size=batch, yield_keys=True, **ranks)
        if batching == "token-budget":
            return TokenBudgetBatches(lengths, int(MAX_TOKENS * fraction), strategy=strategy, window=WINDOW, **ranks)
        split = batching == "packed-split"
        return PackedRows(lengths, SEQ_LEN, split_records=split, strategy=strategy, window=WINDOW, batch_size=batch,
                          **ranks)  # fmt: skip

    def unit(self, item: Any) -> Unit:
        if isinstance(item, tuple) and hasattr(item, "position"):  # a SampleKey: one record at one position
            return Unit(item.epoch, item.position, item.index, item.is_padding)
        content = tuple(tuple(piece) if isinstance(piece, tuple) else int(piece) for piece in item)
        return Unit(item.key.epoch, item.key.index, content, item.key.is_padding)

    def tokens(self, units: list[Unit], batching: str) -> Counter[Any]:
        """Every token the units hold, as (record, token) (fixed batches and whole rows: every token of each record
        once per draw; split rows: the slices' tokens), counted."""
        if batching == "packed-split":
            return Counter((record, t) for u in units for record, a, b in u.content for t in range(a, b))
        if batching == "fixed":
            records = [u.content for u in units]
        elif batching == "packed-whole":
            records = [piece[0] for u in units for piece in u.content]
        else:
            records = [record for u in units for record in u.content]
        return Counter((record, t) for record in records for t in range(LENGTHS[record]))

    def draw_tokens(
        self, order: str, batching: str, consumed: list[Unit], after: dict[int, Any], state: Any
    ) -> Counter[Any]:
        """The tokens of the epoch's draws, from the strategy itself (for a mixture changed at the resume: the saving
        run's draws before the saved position, then the resumed order's, ``after``, id -> record; packed, the saving
        mixture's draws up to the end of the saved row's window, then the new mixture's continued there)."""
        if order == "mixture-continue" and batching == "fixed":
            records = [u.content for u in consumed] + list(after.values())
        elif order == "mixture-continue":
            splice = state["strategy_state"]["splice"]
            window = state["packing"]["window"]  # the saved row's: the splice is at its end (its start if unread)
            assert splice in (window * WINDOW, min((window + 1) * WINDOW, NUM_SAMPLES))
            saving, n = _strategy(order, resumed=False), sum(SIZES)
            draws = [*saving.draws_before(0, splice).tolist(), 0]
            continued = _strategy(order, resumed=True).continued_at(splice, draws)
            records = saving.pass_order(n, SEED, 0)(np.arange(splice)).tolist()
            records += continued.pass_order(n + APPENDED, SEED, 0)(np.arange(splice, NUM_SAMPLES)).tolist()
        else:
            strategy, n = _strategy(order, resumed=False), sum(SIZES)
            records = strategy.pass_order(n, SEED, 0)(np.arange(strategy.pass_length(n, 0), dtype=np.int64)).tolist()
        return Counter((record, t) for record in records for t in range(LENGTHS[record]))

    def appended(self, unit: Unit) -> bool:
        """Whether a unit holds a record of the source appended at the resume."""
        pieces = unit.content if isinstance(unit.content, tuple) else (unit.content,)
        return any((piece[0] if isinstance(piece, tuple) else piece) >= sum(SIZES) for piece in pieces)


# The stream row: corpus 0 is map-style (a list of records), corpora 1 and 2 are sharded streams, the corpus appended
# at the resume is a third; "uniform" is one stream of all the saved run's records. Counts are records per shard.
CORPUS_SHARDS = ([6, 0, 9, 7], [4, 6])  # SIZES[1] and SIZES[2] records
APPENDED_SHARDS = [5, 3]
UNIFORM_SHARDS = [6, 8, 0, 9, 7, 4, 6, 6]
STREAM_WINDOW = 2


def record(index: int) -> dict[str, list[int]]:
    """Record ``index`` of the sources concatenated: ``LENGTHS[index]`` tokens, each ``index * 1000 + t``."""
    return {"input_ids": [index * 1000 + t for t in range(LENGTHS[index])]}


class Shards:
    """A stream's shards in memory: its records are ``first``, ``first + 1``, ... of the sources concatenated."""

    def __init__(self, first: int, counts: list[int]) -> None:
        self.counts = counts
        self.offsets = np.concatenate(([first], first + np.cumsum(counts))).tolist()

    def count(self, shard: str) -> int:
        return self.counts[int(shard)]

    def read(self, shard: str, start: int, stop: int) -> list[dict[str, list[int]]]:
        return [record(self.offsets[int(shard)] + row) for row in range(start, stop)]


def _sharded(first: int, counts: list[int], seed: int, **options: Any) -> ShardedStream:
    shards = [str(i) for i in range(len(counts))]
    return ShardedStream(shards, Shards(first, counts), **{"batch_size": 1, "window": STREAM_WINDOW, "seed": seed,
                                                            **options})  # fmt: skip


class Streamed(MapStyle):
    """Stream sources: ``ShardedStream`` (uniform) or ``MixedStream`` (weighted: the corpora at fixed weights; the
    mixtures, as map-style's), batched by the stream (keyed) or packed by ``PackedStream``."""

    name = "stream"

    def stream(self, order: str, resumed: bool, **options: Any) -> ShardedStream:
        """The cell's stream, built without ranks unless ``options`` give them."""
        if order == "uniform":
            return _sharded(0, UNIFORM_SHARDS, SEED, **options)
        corpora: list[Any] = [
            [record(i) for i in range(SIZES[0])],
            _sharded(SIZES[0], CORPUS_SHARDS[0], seed=1),
            _sharded(SIZES[0] + SIZES[1], CORPUS_SHARDS[1], seed=2),
        ]
        weights, change = [3, 1, 2], {}
        if order == "mixture-schedule":
            change = {"schedule": {CHANGE: [1, 3, 1], 1: [1, 1, 1]}}
        if order == "mixture-continue" and resumed:
            corpora.append(_sharded(sum(SIZES), APPENDED_SHARDS, seed=3))
            weights, change = [1, 2, 0, 3], {"on_change": "continue"}
        options.setdefault("batch_size", 1)
        return MixedStream(corpora, weights, num_samples=NUM_SAMPLES, seed=SEED, **change, **options)

    def build(self, order: str, batching: str, *, resumed: bool, world: int, rank: int, fraction: float = 1) -> Any:
        batch = int(PER_RANK_BATCH[batching] * fraction)
        ranks = {"num_replicas": world, "rank": rank}
        if batching == "fixed":
            return self.stream(order, resumed, batch_size=batch, yield_keys=True, **ranks)
        if batching == "token-budget":  # there is none over a stream: a stream given as lengths is refused
            return TokenBudgetBatches(self.stream(order, resumed), int(MAX_TOKENS * fraction), seed=SEED, **ranks)
        split = batching == "packed-split"
        return PackedStream(self.stream(order, resumed), SEQ_LEN, split_records=split, window=WINDOW, batch_size=batch,
                            **ranks)  # fmt: skip

    def unit(self, item: Any) -> Unit:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], tuple):  # (record, SampleKey)
            found, key = item
            assert found == record(key.index)  # the record read is the one its key names
            return Unit(key.epoch, key.position, key.index, key.is_padding)
        return super().unit(item)

    def draw_tokens(
        self, order: str, batching: str, consumed: list[Unit], after: dict[int, Any], state: Any
    ) -> Counter[Any]:
        if order == "mixture-continue" and batching == "fixed":
            records = [u.content for u in consumed] + list(after.values())
        elif order == "mixture-continue":  # packed: the saving stream's draws up to the splice, the changed one's on
            splice = state["strategy_state"]["splice"]
            assert splice == min((state["packing"]["window"] + 1) * WINDOW, NUM_SAMPLES)
            saving, changed = self.stream(order, resumed=False), self.stream(order, resumed=True)
            assert isinstance(saving, MixedStream) and isinstance(changed, MixedStream)
            changed.load_state_dict(saving.state_at(0, splice))  # MixedStream's own continuation at the splice
            records = saving.epoch_indices(0, np.arange(splice)).tolist()
            records += changed.epoch_indices(0, np.arange(splice, NUM_SAMPLES)).tolist()
        else:  # the epoch's draws, as the stream alone (no ranks) delivers them
            records = [key.index for _, key in self.stream(order, resumed=False, yield_keys=True)]
        return Counter((index, t) for index in records for t in range(LENGTHS[index]))


SOURCES = {"map-style": MapStyle(), "stream": Streamed()}

# The cells that are refused, with why, and the exact error (type, message) they raise where they are refused.
_HALF_BUDGET = (
    IncompatibleStateError,
    (
        "state field 'packing.settings.max_tokens': saved 40, expected 20: the saved run's rows were packed with "
        "max_tokens=40: build the sampler with max_tokens=40 to resume it (another max_tokens is another order)"
    ),
)
REFUSED = {
    # a token budget's per-rank batch is its max_tokens, which shapes every batch: half of it is another order
    **{("map-style", o, "token-budget", "half-batch"): _HALF_BUDGET for o in ORDERS},
}  # fmt: skip
# The batchings a source does not have, refused when they are built, with the exact error: the library has no
# token-budget batching of a stream (TokenBudgetBatches takes lengths; a stream given for them is refused before
# any record of it is read, pointing at PackedStream).
_NOT_LENGTHS = (
    "Stream, a stream of records, not their token counts: pack a stream with stateful_sampler.stream.PackedStream "
    "(a token budget over a stream is not built)"
)
UNBUILT = {("stream", "token-budget"): (TypeError, _NOT_LENGTHS)}
CELLS = [(s, o, b) for s in SOURCES for o in ORDERS for b in BATCHINGS if (s, b) not in UNBUILT]
SAME = [cell for cell in CELLS if (*cell, "same") not in REFUSED]
ELASTIC = [(*cell, t) for cell in CELLS for t in TOPOLOGIES if (*cell, t) not in REFUSED]


def _steps(source: Any, sampler: Any, batching: str, count: int | None = None) -> list[list[Unit]]:
    """``count`` steps of the sampler's current epoch (all that are left: ``None``), each the step's units."""
    size = 1 if batching == "token-budget" else sampler.batch_size
    items = iter(sampler)
    steps = []
    while count is None or len(steps) < count:
        step = [source.unit(item) for item in islice(items, size)]
        if not step:
            break
        steps.append(step)
    return steps


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def _saved(source: Any, order: str, batching: str, world: int, fraction: float, steps: int) -> tuple[list[Unit], Any]:
    """``world`` ranks of the saving run take ``steps`` steps: what they consumed, and the state they all save."""
    consumed: list[Unit] = []
    states = []
    for rank in range(world):
        sampler = source.build(order, batching, resumed=False, world=world, rank=rank, fraction=fraction)
        consumed += [unit for step in _steps(source, sampler, batching, steps) for unit in step]
        states.append(_round_trip(sampler.state_dict(consumed_batches=steps)))
    assert all(state == states[0] for state in states)  # one state, whatever the rank
    return consumed, states[0]


def _resumed(source: Any, order: str, batching: str, state: Any, world: int, rank: int, fraction: float = 1) -> Any:
    sampler = source.build(order, batching, resumed=True, world=world, rank=rank, fraction=fraction)
    sampler.load_state_dict(state)
    return sampler


def _two_epochs(source: Any, sampler: Any, batching: str) -> Iterator[list[Unit]]:
    epoch = sampler.epoch  # a stream taken to its pass's end is at the next epoch already
    yield from _steps(source, sampler, batching)
    sampler.set_epoch(epoch + 1)
    yield from _steps(source, sampler, batching)


@pytest.mark.parametrize(("source", "order", "batching"), SAME)
def test_at_the_same_topology_a_resume_gives_the_uninterrupted_runs_batches(source, order, batching):
    source = SOURCES[source]
    world = SAME_WORLD
    consumed, state = _saved(source, order, batching, world, 1, steps=1)
    resumed = [
        list(_two_epochs(source, _resumed(source, order, batching, state, world, r), batching)) for r in range(world)
    ]
    if order != "mixture-continue":
        for rank in range(world):
            uninterrupted = source.build(order, batching, resumed=False, world=world, rank=rank)
            assert resumed[rank] == list(_two_epochs(source, uninterrupted, batching))[1:]
    else:  # the run changed its mixture at the resume: it goes on from the saved position, with the new source
        first = [u for steps in resumed for u in steps[0]]
        assert min(u.id for u in first) == max(u.id for u in consumed) + 1
        assert any(source.appended(u) for steps in resumed for step in steps for u in step)
    # a later checkpoint of the resumed run (after the change: the resume for "continue", CHANGE for
    # "mixture-schedule", in or past its window) resumes it exactly, step by step
    for rank in range(world):
        live = _resumed(source, order, batching, state, world, rank)
        _steps(source, live, batching, LATER)
        later = _round_trip(live.state_dict(consumed_batches=LATER))
        again = source.build(order, batching, resumed=True, world=world, rank=rank)
        again.load_state_dict(later)
        assert list(_two_epochs(source, again, batching)) == resumed[rank][LATER:]


def _reference(source: Any, order: str, batching: str, state: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """The epoch on one rank, id -> content: as the saving run's order places it, and as the resumed run's order
    continues it from ``state`` (the same order, but for a mixture changed at the resume)."""
    alone = source.build(order, batching, resumed=False, world=1, rank=0)
    before = {u.id: u.content for step in _steps(source, alone, batching) for u in step}
    if order != "mixture-continue":
        return before, before
    after = _resumed(source, order, batching, state, 1, 0)
    return before, {u.id: u.content for step in _steps(source, after, batching) for u in step}


@pytest.mark.parametrize(("source", "order", "batching", "topology"), ELASTIC)
def test_at_another_topology_every_unconsumed_token_comes_once_in_equal_steps(source, order, batching, topology):
    source = SOURCES[source]
    saving_world, saving_fraction, world, fraction = TOPOLOGIES[topology]
    consumed, state = _saved(source, order, batching, saving_world, saving_fraction, steps=1)
    shares = [
        _steps(source, _resumed(source, order, batching, state, world, r, fraction), batching) for r in range(world)
    ]
    assert len({len(share) for share in shares}) == 1  # equal steps on every rank
    rest = [u for share in shares for step in share for u in step if not u.is_padding]
    real = [u for u in consumed if not u.is_padding]
    before, after = _reference(source, order, batching, state)
    ids = sorted(u.id for u in real + rest)
    # every row (position) of the epoch once: nothing consumed again, nothing lost (a changed mixture's packed epoch
    # has the rows of its new order after the saved ones)
    assert ids == (sorted(before) if order != "mixture-continue" else sorted({u.id for u in real} | set(after)))
    assert all(before[u.id] == u.content for u in real)
    assert all(after[u.id] == u.content for u in rest)  # where the order, changed or not, puts it
    assert source.tokens(real + rest, batching) == source.draw_tokens(order, batching, real, after, state)


@pytest.mark.parametrize(("source", "order", "batching", "topology"), sorted(REFUSED))
def test_the_cells_not_supported_are_refused_with_a_clear_error(source, order, batching, topology):
    error, message = REFUSED[source, order, batching, topology]
    source = SOURCES[source]
    saving_world, saving_fraction, world, fraction = TOPOLOGIES.get(topology, (SAME_WORLD, 1, SAME_WORLD, 1))
    _, state = _saved(source, order, batching, saving_world, saving_fraction, steps=1)
    with pytest.raises(error, match=re.escape(message)):
        _resumed(source, order, batching, state, world, 0, fraction)


@pytest.mark.parametrize(("source", "order", "batching"), [(s, o, b) for s, b in UNBUILT for o in ORDERS])
def test_a_batching_a_source_does_not_have_is_refused_when_it_is_built(source, order, batching):
    error, message = UNBUILT[source, batching]
    with pytest.raises(error, match=re.escape(message)):
        SOURCES[source].build(order, batching, resumed=False, world=SAME_WORLD, rank=0)


@pytest.mark.slow
def test_a_sigkilled_run_of_every_batching_resumes_at_0_workers_with_the_uninterrupted_batches(tmp_path: Path) -> None:
    """One real SIGKILL for the map-style row: the four batchings over a mixture changed mid-epoch run in lockstep
    with 2 workers, are killed after step 3 (before the change) and resume with 0 workers."""
    record, state = tmp_path / "cut.jsonl", tmp_path / "cut.json"
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "tests.compose.matrix_kill_run", "--record", str(record), "--state", str(state),
         *map(str, args)], cwd=Path(__file__).resolve().parents[2], timeout=300, check=False,
    )  # fmt: skip
    assert run("--workers", 2, "--kill-after", 3).returncode == -9
    assert len(record.read_text().splitlines()) == 3
    assert run("--workers", 0).returncode == 0
    cut: dict[str, list[Any]] = {}
    for line in record.read_text().splitlines():
        for name, batch in json.loads(line).items():
            cut.setdefault(name, []).append(batch)
    whole = {name: json.loads(json.dumps(list(loader))) for name, loader in loaders(0).items()}
    assert cut == whole
    assert all(len(batches) > 3 for batches in whole.values())  # each was cut mid-epoch
