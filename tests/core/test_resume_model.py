"""Model-based test of the resume contract: random runs of draw, prefetch, save, crash and resume
(with another world size or batch size), checked after every step against a deliberately simple
reference: the epoch's order is the permutation of its pass (the stream of passes under carry),
and a run consumes it front to back, one global batch per step.

Invariants (docs/core.md, "Elastic resume"):
- what the run consumes, step after step and across crashes, is exactly the reference order from
  the epoch's start: nothing consumed twice, nothing skipped; ``drop`` names what it cut;
- every rank takes the same number of steps (except under ``uneven``);
- every rank's saved state is the same (under ``uneven``, rank 0's is the run's);
- while W and B never changed, the batches are exactly those of the uninterrupted run.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stateful_sampler import SampleKey, StatefulSampler
from tests.helpers import json_round_trip, scaled_examples

TAILS = ("pad", "drop", "uneven", "carry")


@lru_cache(maxsize=4096)
def reference_pass(size: int, seed: int, pass_index: int) -> list[int]:
    """The permutation of one pass: the uniform order the layout and resume logic place."""
    return StatefulSampler(size, seed=seed, tail="uneven").indices(pass_index).tolist()


@dataclass
class Snapshot:
    """What the model knows at a save: the saved state and what had been consumed by then."""

    state: dict[str, Any]
    epoch: int
    consumed: list[tuple[int, int]]  # (pass, record) of the epoch, in consumption order
    stream: int  # carry: stream positions consumed before the epoch
    configs: set[tuple[int, int]]  # the (W, B) in force during the epoch
    batches: list[list[list[int]]]  # the epoch's steps so far: per rank, the batch's records
    changed: bool


@dataclass
class Rank:
    sampler: StatefulSampler
    iterator: Any = None
    ahead: deque = field(default_factory=deque)  # drawn by "workers", not yet consumed
    batches: int = 0  # consumed in the current pass
    exhausted: bool = False


class ResumeMachine(RuleBasedStateMachine):
    @initialize(
        size=st.integers(0, 40),
        seed=st.integers(0, 2**63 - 1),
        tail=st.sampled_from(TAILS),
        world_size=st.integers(1, 5),
        batch_size=st.integers(1, 6),
    )
    def start(self, size: int, seed: int, tail: str, world_size: int, batch_size: int) -> None:
        self.size, self.seed, self.tail = size, seed, tail
        world_size = self._fit(world_size)
        self.initial = (world_size, batch_size)
        self.changed = False  # W or B differs from the start at some point of this run
        self.epoch = 0
        self.consumed: list[tuple[int, int]] = []
        self.stream = 0
        self.steps: list[list[list[int]]] = []
        self.saved: Snapshot | None = None
        self._build(world_size, batch_size)
        self.configs = {(world_size, batch_size)}
        self.reference_batches: dict[int, list[list[list[int]]]] = {}

    def _fit(self, world_size: int) -> int:
        """``drop`` refuses more ranks than records, as DistributedSampler does."""
        return min(world_size, self.size) if self.tail == "drop" and self.size else world_size

    def _build(self, world_size: int, batch_size: int) -> None:
        self.world_size, self.batch_size = world_size, batch_size
        self.ranks = [
            Rank(
                StatefulSampler(
                    self.size,
                    seed=self.seed,
                    tail=self.tail,
                    num_replicas=world_size,
                    rank=rank,
                    batch_size=batch_size,
                    yield_keys=True,
                )
            )
            for rank in range(world_size)
        ]

    def _begin_pass(self) -> None:
        for rank in self.ranks:
            if rank.iterator is None:
                rank.sampler.set_epoch(self.epoch)  # Lightning calls it on the resumed epoch too
                rank.iterator = iter(rank.sampler)

    def _next_batch(self, rank: Rank) -> list[SampleKey]:
        batch = []
        while len(batch) < self.batch_size and rank.ahead:
            batch.append(rank.ahead.popleft())
        while len(batch) < self.batch_size:
            key = next(rank.iterator, None)
            if key is None:
                break
            batch.append(key)
        return batch

    # -- rules

    @precondition(lambda self: not self._epoch_done())
    @rule(steps=st.integers(1, 4))
    def train(self, steps: int) -> None:
        """Every rank consumes one batch a step; a step's records are the next global batch."""
        self._begin_pass()
        for _ in range(steps):
            batches = [self._next_batch(rank) for rank in self.ranks]
            sizes = [len(batch) for batch in batches]
            if self.tail != "uneven":
                assert len({min(size, 1) for size in sizes}) == 1, f"unequal step counts: batch sizes {sizes}"
            if not any(sizes):
                for rank in self.ranks:
                    rank.exhausted = True
                return
            for rank, batch in zip(self.ranks, batches):
                if batch:
                    rank.batches += 1
                else:
                    rank.exhausted = True
            self._consume(batches)

    def _consume(self, batches: list[list[SampleKey]]) -> None:
        keys = sorted((key for batch in batches for key in batch), key=lambda key: key.position)
        real = [(key.epoch, key.index) for key in keys if not key.is_padding]
        expected = self._reference_stream(len(self.consumed), len(real))
        assert real == expected, f"epoch {self.epoch}: consumed {real}, reference {expected}"
        order = reference_pass(self.size, self.seed, self.epoch)
        for key in keys:
            if key.is_padding:  # a marked repeat, taken from the start of the epoch's order
                assert self.tail == "pad" and key.position >= self.size and key.index == order[key.position % self.size]
        self.consumed += real
        self.steps.append([[key.index for key in batch] for batch in batches])

    def _reference_stream(self, start: int, count: int) -> list[tuple[int, int]]:
        """Entries [start, start+count) of the epoch's reference order, as (pass, record)."""
        if self.tail != "carry":
            order = reference_pass(self.size, self.seed, self.epoch)
            return [(self.epoch, record) for record in order[start : start + count]]
        out = []
        for position in range(self.stream + start, self.stream + start + count):
            pass_index, offset = divmod(position, self.size)
            out.append((pass_index, reference_pass(self.size, self.seed, pass_index)[offset]))
        return out

    @precondition(lambda self: not self._epoch_done())
    @rule(rank_index=st.integers(0, 4), items=st.integers(1, 9))
    def prefetch(self, rank_index: int, items: int) -> None:
        """DataLoader workers draw ahead of training; what they drew is not consumed."""
        self._begin_pass()
        rank = self.ranks[rank_index % len(self.ranks)]
        for key in rank.iterator:
            rank.ahead.append(key)
            items -= 1
            if not items:
                break

    @rule(rank_index=st.integers(0, 4))
    def save(self, rank_index: int) -> None:
        """Save what training consumed; every rank must save the same state."""
        self._begin_pass()
        states = [json_round_trip(rank.sampler.state_dict(consumed_batches=rank.batches)) for rank in self.ranks]
        if self.tail != "uneven":
            assert all(state == states[0] for state in states), f"ranks disagree: {states}"
        for rank, state in zip(self.ranks, states):
            if not rank.ahead and rank.iterator is not None and rank.batches:
                drawn = json_round_trip(rank.sampler.state_dict())
                if drawn != state:  # the pass ended: after the loop, the next epoch's start (issue 17)
                    ended = (drawn["epoch"], drawn["position"]) == (state["epoch"] + 1, 0)
                    assert state["position"] == state["epoch_end"] and ended, f"drawn {drawn} != consumed {state}"
        authoritative = states[0] if self.tail == "uneven" else states[rank_index % len(states)]
        self.saved = Snapshot(
            authoritative,
            self.epoch,
            list(self.consumed),
            self.stream,
            set(self.configs),
            [list(s) for s in self.steps],
            self.changed,
        )

    @precondition(lambda self: self.saved is not None)
    @rule(world_size=st.integers(1, 5), batch_size=st.integers(1, 6))
    def crash_and_resume(self, world_size: int, batch_size: int) -> None:
        """A new process with any ranks and batch size continues from the last save."""
        saved = self.saved
        assert saved is not None
        world_size = self._fit(world_size)
        self._build(world_size, batch_size)
        for rank in self.ranks:
            rank.sampler.load_state_dict(saved.state)
        self.epoch, self.consumed, self.stream = saved.epoch, list(saved.consumed), saved.stream
        self.configs = saved.configs | {(world_size, batch_size)}
        self.steps = [list(s) for s in saved.batches]
        self.changed = saved.changed or (world_size, batch_size) != self.initial

    @precondition(lambda self: self._epoch_done())
    @rule()
    def next_epoch(self) -> None:
        """The epoch is over: check its coverage against the reference, then start the next one."""
        order = reference_pass(self.size, self.seed, self.epoch)
        sampler = self.ranks[0].sampler
        if self.tail in ("pad", "uneven"):
            assert sorted(record for _, record in self.consumed) == sorted(order)
        elif self.tail == "drop":
            dropped = sampler.dropped_indices(self.epoch)
            assert [record for _, record in self.consumed] + dropped == order
            assert len(dropped) < max(world_size for world_size, _ in self.configs)
        else:
            self.stream += len(self.consumed)
            # Only a remainder smaller than a global batch of the pass is left for the next epoch (the
            # global batch in force where the epoch's end was fixed: an epoch saved as finished keeps it).
            assert (self.epoch + 1) * self.size - self.stream < max(
                world_size * batch_size for world_size, batch_size in self.configs
            )
        if not self.changed:
            assert self.steps == self._uninterrupted(self.epoch), "same ranks and batch size, other batches"
        self.epoch += 1
        self.consumed, self.steps = [], []
        self.configs = {(self.world_size, self.batch_size)}
        for rank in self.ranks:
            rank.iterator, rank.ahead, rank.batches, rank.exhausted = None, deque(), 0, False

    def _uninterrupted(self, epoch: int) -> list[list[list[int]]]:
        """The steps of epoch ``epoch`` in a run that was never interrupted nor changed."""
        if not self.reference_batches:
            world_size, batch_size = self.initial
            samplers = [
                StatefulSampler(
                    self.size, seed=self.seed, tail=self.tail, num_replicas=world_size, rank=rank, batch_size=batch_size
                )
                for rank in range(world_size)
            ]
            for each in range(epoch + 1):
                per_rank = []
                for sampler in samplers:
                    sampler.set_epoch(each)
                    order = list(sampler)
                    per_rank.append([order[i : i + batch_size] for i in range(0, len(order), batch_size)])
                steps = max(len(batches) for batches in per_rank)
                self.reference_batches[each] = [
                    [batches[step] if step < len(batches) else [] for batches in per_rank] for step in range(steps)
                ]
        if epoch not in self.reference_batches:
            self.reference_batches.clear()
            return self._uninterrupted(epoch)
        return self.reference_batches[epoch]

    def _epoch_done(self) -> bool:
        return all(rank.exhausted for rank in self.ranks)

    @invariant()
    def nothing_consumed_twice(self) -> None:
        if self.tail != "carry" and hasattr(self, "consumed"):
            records = [record for _, record in self.consumed]
            assert len(records) == len(set(records))


ResumeMachine.TestCase.settings = settings(
    max_examples=scaled_examples(int(os.environ.get("RESUME_MODEL_EXAMPLES", "600"))),
    stateful_step_count=30,
    deadline=None,
)
test_resume_contract_against_the_reference_model = ResumeMachine.TestCase
