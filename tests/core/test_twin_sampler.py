"""Twin test of ``StatefulSampler`` (issue 17; docs/core.md, "Epoch ends and early exits").

A live run of W ranks and, after every save, a twin of W ranks restored fresh from the live ranks'
``state_dict()`` (through JSON). Every rule applies the same call to every rank of both: ``iter``,
``next`` k times, a break out of the pass, ``set_epoch(any)``, a save, a second iterator; after every
rule each rank's ``len``, ``remaining_length``, ``indices``, ``epoch`` and ``state_dict`` must be equal,
as must everything both yield. Every strategy and tail, W from 1 to 4.

The live iterator under way at a save is the one a resumed process replaces by its first ``iter``:
the twin's first ``next`` on that pass opens it, on every rank whose live iterator has not seen its
end (one that has is over: that rank's twin pass is its next ``iter``, as after the loop). Iterators
older than the newest at a save have no twin (a resumed process cannot hold them): they keep running
on the live side, and must not move the state the twin agrees with.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stateful_sampler import StatefulSampler
from tests.twin_helpers import EPOCHS, KINDS, SamplerConfig, json_round_trip, outcome, sampler_configs, take

# Examples per strategy: 7 strategies x 150 = 1,050 runs of up to 20 steps (TWIN_SAMPLER_EXAMPLES for more).
EXAMPLES = int(os.environ.get("TWIN_SAMPLER_EXAMPLES", "150"))
PENDING, NO_TWIN, REAL = "pending", "no twin", "real"


@dataclass
class Slot:
    """One iterator per rank on the live side and, where it has one, on the twin side."""

    live: list[Iterator[Any]]
    twin: list[Iterator[Any] | None] | None  # None on a rank whose live pass had ended at the save
    mode: str
    drawn: list[int]
    stopped: list[bool]
    serial: int  # the how-manieth iter() of the run: the sampler's pass is the latest one's


class SamplerTwins(RuleBasedStateMachine):
    kind = "uniform"

    @initialize(data=st.data())
    def build(self, data: Any) -> None:
        config: SamplerConfig = data.draw(sampler_configs(self.kind), label="config")
        self.config = config
        built = outcome(config.ranks)
        if built[0] == "raised":  # refused at construction (drop on more ranks than the pass, ...)
            assert built[1] == "ValueError", built
        assume(built[0] == "ok")
        self.live: list[StatefulSampler] = built[1]
        self.twin: list[StatefulSampler] | None = None
        self.slots: list[Slot] = []
        self.serial = 0
        self.log: list[str] = []

    def _note(self, text: str) -> None:
        self.log.append(text)

    # -- the calls

    @rule()
    def open_iter(self) -> None:
        """``iter()`` on every rank of both, a second iterator if one is under way (at most two kept)."""
        self._note("iter")
        if len(self.slots) == 2:
            self.slots.pop(0)
        for slot in self.slots:
            if slot.mode == PENDING:
                slot.mode, slot.twin = NO_TWIN, None  # the twin's own new pass replaces the restored one
        live = [iter(sampler) for sampler in self.live]
        twin = None if self.twin is None else [iter(sampler) for sampler in self.twin]
        mode = NO_TWIN if twin is None else REAL
        self.serial += 1
        self.slots.append(Slot(live, twin, mode, [0] * len(live), [False] * len(live), self.serial))

    @precondition(lambda self: self.slots)
    @rule(which=st.integers(0, 1), count=st.integers(1, 14))
    def next_items(self, which: int, count: int) -> None:
        """``next()`` ``count`` times on one iterator, on every rank of both."""
        slot = self.slots[min(which, len(self.slots) - 1)]
        self._note(f"next x{count} on slot {self.slots.index(slot)}")
        if slot.mode == PENDING:  # a rank whose live iterator saw its end has no twin (its next iter() is)
            slot.twin = [None if stopped else iter(sampler) for sampler, stopped in zip(self.twin, slot.stopped)]  # type: ignore[arg-type]
            slot.mode = REAL
        for rank, iterator in enumerate(slot.live):
            got = take(iterator, count)
            slot.drawn[rank] += len(got[0])
            slot.stopped[rank] = slot.stopped[rank] or got[1]
            if slot.mode == REAL and slot.twin[rank] is not None:  # type: ignore[index]
                assert take(slot.twin[rank], count) == got, (rank, self.log)  # type: ignore[index]

    @precondition(lambda self: self.slots)
    @rule(which=st.integers(0, 1))
    def break_out(self, which: int) -> None:
        """Leave a pass: the loop breaks and its iterator is dropped."""
        self._note("break")
        self.slots.pop(min(which, len(self.slots) - 1))

    @rule(epoch=EPOCHS)
    def set_epoch(self, epoch: int) -> None:
        """The loop left its pass (ended or broke), then ``set_epoch``."""
        self._note(f"set_epoch({epoch})")
        self.slots.clear()
        for rank, sampler in enumerate(self.live):
            got = outcome(partial(sampler.set_epoch, epoch))
            if self.twin is not None:
                assert outcome(partial(self.twin[rank].set_epoch, epoch)) == got, (rank, self.log)  # type: ignore[index]

    @rule()
    def save(self) -> None:
        """``state_dict()`` on every live rank; the twin is rebuilt fresh from those states."""
        self._restore([outcome(sampler.state_dict) for sampler in self.live], "save")

    @precondition(lambda self: self.config.batch_size and self.slots and self.slots[-1].serial == self.serial)
    @rule()
    def save_consumed(self) -> None:
        """``state_dict(consumed_batches=k)`` inside the loop, at a batch boundary of the newest pass."""
        batch, slot = self.config.batch_size, self.slots[-1]
        if any(slot.stopped) or any(drawn % batch for drawn in slot.drawn):  # type: ignore[operator]
            return
        states = [outcome(partial(sampler.state_dict, consumed_batches=slot.drawn[rank] // batch))  # type: ignore[operator]
                  for rank, sampler in enumerate(self.live)]  # fmt: skip
        self._restore(states, "save consumed")

    def _restore(self, states: list[tuple[Any, ...]], what: str) -> None:
        self._note(what)
        if any(state[0] == "raised" for state in states):
            return  # refused: the twin (if any) must refuse the same, which the invariant checks
        twin = self.config.ranks()
        for sampler, state in zip(twin, states):
            sampler.load_state_dict(json_round_trip(state[1]))
        self.twin = twin
        for slot in self.slots:
            newest = slot.serial == self.serial and not all(slot.stopped)
            slot.mode, slot.twin = (PENDING if newest else NO_TWIN), None

    # -- what both report

    @invariant()
    def reports_agree(self) -> None:
        if self.twin is None:
            return
        for rank, (live, twin) in enumerate(zip(self.live, self.twin)):
            assert reports(twin) == reports(live), (rank, self.log)


def reports(sampler: StatefulSampler) -> dict[str, Any]:
    return {
        "len": outcome(lambda: len(sampler)),
        "remaining_length": outcome(sampler.remaining_length),
        "indices": outcome(lambda: sampler.indices().tolist()),
        "epoch": outcome(lambda: sampler.epoch),
        "state_dict": outcome(sampler.state_dict),
    }


def _machine(kind: str) -> type[SamplerTwins]:
    machine = type(f"SamplerTwins_{kind}", (SamplerTwins,), {"kind": kind})
    machine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=20, deadline=None)
    return machine


MACHINES = {kind: _machine(kind) for kind in KINDS}


@pytest.mark.slow  # exhaustive: 1,050 runs
@pytest.mark.parametrize("kind", KINDS)
def test_a_restored_sampler_behaves_as_the_live_one_for_every_later_call(kind: str) -> None:
    MACHINES[kind].TestCase().runTest()
