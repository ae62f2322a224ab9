"""Issue 26's matrix, map-style rows: {map-style} x {uniform, weighted, mixture changed mid-epoch, mixture changed
at the resume with a source appended} x {fixed batches, packed split, packed whole, token budget}.

For every supported cell, a state saved mid-epoch resumes at the same topology with the uninterrupted run's batches
step by step (and a later checkpoint of the resumed run resumes exactly too), and at W 4->3, 3->4 and half the
per-rank batch (ranks simulated in one process) with every unconsumed record, every token for packed rows, exactly
once, nothing consumed again, in equal steps on every rank. The cells that are not supported are listed in
``REFUSED`` with the exact error they raise. One real SIGKILL (slow) covers the row's four batchings at once: run
in lockstep with 2 workers by ``matrix_kill_run.py``, killed mid-epoch, resumed with 0 workers.

A *source* builds what a cell runs (``MapStyle``: a ``StatefulSampler`` or a packed sampler over a ``Mixture`` of
map-style datasets); stream sources (``MixedStream``, ``PackedStream``) join as another entry of ``SOURCES``.
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
            assert splice == min((state["packing"]["window"] + 1) * WINDOW, NUM_SAMPLES)
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


SOURCES = {"map-style": MapStyle()}

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
CELLS = [(s, o, b) for s in SOURCES for o in ORDERS for b in BATCHINGS]
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
    yield from _steps(source, sampler, batching)
    sampler.set_epoch(sampler.epoch + 1)
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
