"""``PackedRows`` / ``TokenBudgetBatches`` over ``Mixture(on_change="continue")``: a state saved under another mixture
(other weights, other schedule entries after the saved position, a source appended) continues, spliced at the end of
the saved row's window. Checked against the mixtures' own public order (``pass_order``, ``draws_before``,
``continued_at``), not the packing code: the rows up to the splice are the saving run's, every token of the spliced
draws comes exactly once (elastic too), a later checkpoint resumes the changed run exactly, and the twin property.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize
from torch.utils.data import DataLoader

from stateful_sampler import IncompatibleStateError, Mixture, PackedRows, ResumableLoader, TokenBudgetBatches
from tests.helpers import scaled_examples
from tests.packing.test_packing_twin import KeyedView, RowTwins
from tests.twin_helpers import outcome

SIZES = [5, 9, 6]
APPENDED = 4
NUM_SAMPLES = 30
WINDOW, SEQ_LEN, MAX_TOKENS, SEED = 4, 12, 24, 7
LENGTHS = np.random.default_rng(5).integers(1, SEQ_LEN + 1, sum(SIZES) + APPENDED).tolist()
KINDS = ("split", "whole", "budget")


def saving() -> Mixture:
    """The saving run's mixture: its own weights change at (0, 13), inside a window (positions 12..15)."""
    return Mixture(SIZES, [3, 1, 2], num_samples=NUM_SAMPLES, schedule={(0, 13): [1, 2, 2]})


CHANGES = {
    "weights": lambda: Mixture(SIZES, [1, 1, 4], num_samples=NUM_SAMPLES, on_change="continue"),
    "schedule": lambda: Mixture(
        SIZES,
        [3, 1, 2],
        num_samples=NUM_SAMPLES,
        schedule={(0, 13): [1, 2, 2], (0, 25): [0, 1, 1], 1: [2, 1, 1]},
        on_change="continue",
    ),
    "appended": lambda: Mixture([*SIZES, APPENDED], [1, 2, 0, 3], num_samples=NUM_SAMPLES, on_change="continue"),
}


def build(kind: str, mixture: Mixture, *, world: int = 1, rank: int = 0, batch: int = 2, tail: str = "pad") -> Any:
    lengths = LENGTHS[: sum(mixture.sizes.tolist())]
    common = {"strategy": mixture, "window": WINDOW, "seed": SEED, "num_replicas": world, "rank": rank, "tail": tail}
    if kind == "budget":
        return TokenBudgetBatches(lengths, MAX_TOKENS, **common)
    return PackedRows(lengths, SEQ_LEN, split_records=kind == "split", batch_size=batch, **common)


def round_trip(state: Any) -> Any:
    return json.loads(json.dumps(state))


def saved_after(kind: str, steps: int, **ranks: Any) -> tuple[list[Any], dict[str, Any]]:
    sampler = build(kind, saving(), **ranks)
    taken = list(islice(iter(sampler), steps))
    return taken, round_trip(sampler.state_dict())


def resumed(kind: str, change: str, state: Any, **ranks: Any) -> Any:
    sampler = build(kind, CHANGES[change](), **ranks)
    sampler.load_state_dict(state)
    return sampler


def two_epochs(sampler: Any) -> list[Any]:
    first = [(item.key, list(item)) for item in sampler]
    sampler.set_epoch(sampler.epoch + 1)
    return first + [(item.key, list(item)) for item in sampler]


def spliced_draws(change: str, splice: int) -> list[int]:
    """Epoch 0's draws of the changed run, from the mixtures alone: the saving mixture's up to the splice, then the
    new one continued there with the saving run's draws."""
    before, after = saving(), CHANGES[change]()
    draws = before.draws_before(0, splice).tolist() + [0] * (len(after.sizes) - len(SIZES))
    continued = after.continued_at(splice, draws)
    head = before.pass_order(sum(SIZES), SEED, 0)(np.arange(splice)).tolist()
    if splice == NUM_SAMPLES:
        return head
    return head + continued.pass_order(sum(after.sizes.tolist()), SEED, 0)(np.arange(splice, NUM_SAMPLES)).tolist()


def tokens(kind: str, items: list[Any]) -> Counter[Any]:
    """Every (record, token) the rows or batches hold (whole records: all of their tokens)."""
    if kind == "split":
        return Counter((record, t) for item in items for record, a, b in item for t in range(a, b))
    records = [piece[0] if kind == "whole" else piece for item in items for piece in item]
    return Counter((record, t) for record in records for t in range(LENGTHS[record]))


def draw_tokens(draws: list[int]) -> Counter[Any]:
    return Counter((record, t) for record in draws for t in range(LENGTHS[record]))


@settings(max_examples=scaled_examples(40), deadline=None)
@given(kind=st.sampled_from(KINDS), change=st.sampled_from(sorted(CHANGES)), step=st.integers(0, 40), data=st.data())
def test_a_changed_mixture_continues_the_saved_rows_and_a_later_checkpoint_resumes_it_exactly(
    kind: str, change: str, step: int, data: Any
) -> None:
    uninterrupted = build(kind, saving())
    rows = uninterrupted.rows_in_epoch(0)
    step = min(step, rows)
    taken, state = saved_after(kind, step)
    splice = state["strategy_state"]["splice"]
    window = state["packing"]["window"]
    begun = state["packing"]["start"] < step * (SEQ_LEN if kind == "split" else 1)  # some of the window was read
    assert splice == (NUM_SAMPLES if step == rows else min((window + begun) * WINDOW, NUM_SAMPLES))
    run = two_epochs(resumed(kind, change, state))  # the changed run, uninterrupted from the resume on
    epoch = [items for key, items in run if key.epoch == 0]
    assert [key.index for key, _ in run if key.epoch == 0] == list(range(step, step + len(epoch)))
    # every token of the spliced draws once: the saved run's rows, then the changed run's
    assert tokens(kind, taken + epoch) == draw_tokens(spliced_draws(change, splice))
    # the window in progress keeps its rows: the saving run's own, up to the last row starting in it
    plan = uninterrupted.strategy.rows(0)
    same = [index for index in range(step, rows) if begun and plan.anchor(index)[0] == window]
    whole_rows = [list(item) for item in uninterrupted]
    if kind != "split":
        assert epoch[: len(same)] == [whole_rows[index] for index in same]
    else:  # split rows: the spliced stream cut every SEQ_LEN tokens, row by row
        stream = [(record, t) for record in spliced_draws(change, splice) for t in range(LENGTHS[record])]
        cut = [stream[at : at + SEQ_LEN] for at in range(0, len(stream), SEQ_LEN)]
        expanded = [[(record, t) for record, a, b in items for t in range(a, b)] for items in epoch]
        assert expanded == cut[step:]
    # a later checkpoint of the changed run resumes it exactly, with the same state from then on
    later = data.draw(st.integers(0, len(run)), label="later")
    live = resumed(kind, change, state)
    items = iter(live)
    head = [(item.key, list(item)) for item in islice(items, min(later, len(epoch)))]
    again = resumed(kind, change, round_trip(live.state_dict()))
    assert again.state_dict() == live.state_dict()
    assert head + two_epochs(again) == run


@settings(max_examples=scaled_examples(40), deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    change=st.sampled_from(sorted(CHANGES)),
    topology=st.sampled_from([(4, 3, 2, 2), (3, 4, 2, 2), (4, 4, 2, 1), (2, 1, 1, 3)]),
    steps=st.integers(0, 4),
)
def test_at_another_topology_every_unconsumed_token_of_the_spliced_draws_comes_once_in_equal_steps(
    kind: str, change: str, topology: tuple[int, int, int, int], steps: int
) -> None:
    saving_world, world, saving_batch, batch = topology
    if kind == "budget":
        saving_batch = batch = 1  # one item is one batch (half a budget is another order: refused)
    consumed, states = [], []
    for rank in range(saving_world):
        sampler = build(kind, saving(), world=saving_world, rank=rank, batch=saving_batch)
        steps = min(steps, -(-len(sampler) // saving_batch))  # at most the epoch's steps (the same on every rank)
        items = iter(sampler)
        consumed += [item for item in islice(items, steps * saving_batch) if not item.is_padding]
        states.append(round_trip(sampler.state_dict(consumed_batches=steps)))
    assert all(state == states[0] for state in states)
    state = states[0]
    shares = [list(resumed(kind, change, state, world=world, rank=rank, batch=batch)) for rank in range(world)]
    assert len({-(-len(share) // batch) for share in shares}) == 1  # equal steps on every rank
    rest = [item for share in shares for item in share if not item.is_padding]
    indices = sorted(item.key.index for item in consumed + rest)
    assert indices == list(range(len(indices)))  # every row of the changed epoch once
    assert tokens(kind, consumed + rest) == draw_tokens(spliced_draws(change, state["strategy_state"]["splice"]))


@pytest.mark.parametrize("ended", [True, False])
def test_a_state_at_the_end_of_an_epoch_changes_the_mixture_from_the_next_one(ended: bool) -> None:
    sampler = build("whole", saving())
    items = iter(sampler)
    taken = list(items) if ended else list(islice(items, sampler.rows_in_epoch(0)))  # the loop saw the end, or not
    state = round_trip(sampler.state_dict())
    assert state["strategy_state"]["splice"] == 0 if ended else NUM_SAMPLES  # epoch 1's start, or epoch 0's end
    changed = resumed("whole", "appended", state)
    assert list(changed) == [] if not ended else True
    changed.set_epoch(1)
    continued = CHANGES["appended"]().continued_at(NUM_SAMPLES, [*saving().draws_before(1).tolist(), 0])
    expected = continued.pass_order(sum(SIZES) + APPENDED, SEED, 1)(np.arange(NUM_SAMPLES)).tolist()
    assert sorted(piece[0] for item in changed for piece in item) == sorted(expected)
    assert len(taken) == build("whole", saving()).rows_in_epoch(0)


def test_changes_at_two_resumes_in_one_epoch_keep_both_segments() -> None:
    third = lambda: Mixture([*SIZES, APPENDED], [0, 1, 1, 1], num_samples=NUM_SAMPLES, on_change="continue")
    _, first = saved_after("split", 3)
    second = resumed("split", "appended", first)
    list(islice(iter(second), 4))
    state = round_trip(second.state_dict())
    changed = build("split", third())
    changed.load_state_dict(state)
    run = two_epochs(changed)
    again = build("split", third())
    again.load_state_dict(state)
    head = list(islice(iter(again), 2))
    restored = build("split", third())
    restored.load_state_dict(round_trip(again.state_dict()))
    assert [(item.key, list(item)) for item in head] + two_epochs(restored) == run
    assert len(json.dumps(restored.state_dict())) < 2048  # the kept pieces of epoch 0: a few per change


def test_a_resumable_loader_carries_the_change() -> None:
    def loader(mixture: Mixture) -> ResumableLoader:
        batches = build("budget", mixture)
        return ResumableLoader(DataLoader(range(sum(mixture.sizes.tolist())), batch_sampler=batches))

    first = loader(saving())
    batches = iter(first)
    next(batches), next(batches)
    state = round_trip(first.state_dict())
    changed = loader(CHANGES["appended"]())
    changed.load_state_dict(state)
    plain = build("budget", CHANGES["appended"]())
    plain.load_state_dict(state["sampler"])
    assert [batch.tolist() for batch in changed] == [list(batch) for batch in plain]
    assert changed.sampler.strategy.drawn.change is not None


@pytest.mark.parametrize(
    ("mixture", "field", "message"),
    [
        (lambda: Mixture([5, 8, 6], [1, 1, 1], num_samples=NUM_SAMPLES, on_change="continue"), "sizes[1]",
         "source 1 has another size than in the saved run, or the sources were reordered"),
        (lambda: Mixture([9, 5, 6], [1, 1, 1], num_samples=NUM_SAMPLES, on_change="continue"), "sizes[0]",
         "source 0 has another size than in the saved run, or the sources were reordered"),
        (lambda: Mixture(SIZES, [1, 1, 1], num_samples=NUM_SAMPLES + 1, on_change="continue"), "num_samples",
         "a mixture's epoch length places its epochs in the stream"),
        (lambda: Mixture(SIZES, [1, 1, 1], num_samples=NUM_SAMPLES), "packing.settings.strategy_fingerprint",
         "the saved run's rows were packed over the strategy 'mixture'"),
    ],
)  # fmt: skip
def test_a_mixture_that_cannot_continue_the_saved_one_is_refused_naming_the_field(
    mixture: Any, field: str, message: str
) -> None:
    _, state = saved_after("whole", 3)
    sampler = build("whole", mixture())
    before = sampler.state_dict()
    with pytest.raises(IncompatibleStateError, match=f"state field '{field.replace('[', '.').replace(']', '.')}'"):
        sampler.load_state_dict(state)
    with pytest.raises(IncompatibleStateError, match=message):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == before  # untouched by a state it refuses


def test_other_lengths_for_the_saved_records_are_refused_naming_lengths() -> None:
    _, state = saved_after("split", 3)
    lengths = list(LENGTHS)
    lengths[2] += 1
    sampler = PackedRows(lengths, SEQ_LEN, strategy=CHANGES["appended"](), window=WINDOW, seed=SEED, batch_size=2)
    with pytest.raises(IncompatibleStateError, match="state field 'packing.settings.lengths'"):
        sampler.load_state_dict(state)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.update(splice=-1), "strategy_state.splice"),
        (lambda s: s.update(rows="9"), "strategy_state.rows"),
        (lambda s: s.update(extra=1), "strategy_state"),
        (lambda s: s.update(version=7), "strategy_state.version"),
        (lambda s: s["drawn"]["kept"][0].__setitem__(2, [0, 0, 0]), "strategy_state.kept.0..counts"),
        (lambda s: s["drawn"]["kept"].append([0, 0, [1, 1, 1], [0, 0, 0]]), "strategy_state.kept.1."),
        (lambda s: s["drawn"].pop("held"), "strategy_state"),
    ],
)
def test_an_altered_row_state_is_refused_naming_the_field(edit: Any, field: str) -> None:
    _, state = saved_after("whole", 5)
    edit(state["strategy_state"])
    with pytest.raises(IncompatibleStateError, match=f"state field '{field}"):
        resumed("whole", "appended", state)


class ContinueTwins(RowTwins):
    """The twin machine over a changed run: the live ranks continue a state of the saving mixture with another
    mixture; each twin is a fresh sampler of that mixture loading the live ranks' state."""

    @initialize(data=st.data())
    def build(self, data: Any) -> None:
        kind = data.draw(st.sampled_from(KINDS), label="kind")
        change = data.draw(st.sampled_from(sorted(CHANGES)), label="change")
        world = data.draw(st.integers(1, 3), label="world")
        steps = data.draw(st.integers(0, 12), label="steps")
        tail = data.draw(st.sampled_from(["pad", "drop", "uneven"]), label="tail")
        self.config = ContinueConfig(kind, change, world, tail, 1 if kind == "budget" else 2)  # type: ignore[assignment]
        built = outcome(lambda: [build(kind, saving(), world=world, rank=rank, tail=tail) for rank in range(world)])
        assume(built[0] == "ok")  # else refused at construction (drop on more ranks than rows)
        self.live = self.config.ranks()
        for view, sampler in zip(self.live, built[1]):
            list(islice(iter(sampler), steps))
            view.sampler.load_state_dict(round_trip(sampler.state_dict()))
        self.twin = None
        self.slots = []
        self.serial = 0
        self.log = []


class ContinueConfig:
    def __init__(self, kind: str, change: str, world: int, tail: str, batch_size: int) -> None:
        self.kind, self.change, self.world, self.tail, self.batch_size = kind, change, world, tail, batch_size

    def ranks(self) -> list[KeyedView]:
        return [
            KeyedView(build(self.kind, CHANGES[self.change](), world=self.world, rank=rank, tail=self.tail))
            for rank in range(self.world)
        ]


ContinueTwins.TestCase.settings = settings(max_examples=scaled_examples(40), stateful_step_count=15, deadline=None)
test_a_restored_changed_row_sampler_behaves_as_the_live_one_for_every_later_call = ContinueTwins.TestCase
