"""Twin test of the row samplers (``PackedRows`` split and whole, ``TokenBudgetBatches``) under the core's
contract (docs/core.md, "Epoch ends and early exits"): restored equals live, for every later call.

This is ``tests/core/test_twin_sampler.py``'s machine (iter, next k times, break, a second iterator,
``set_epoch(any)``, saves with and without ``consumed_batches``, ``len``/``remaining_length``/
``indices``/``epoch``/``state_dict`` compared after every rule) driving row samplers on 1-3 ranks under
every tail they take. What the samplers yield is compared with each row's ``SampleKey`` (a row plan's
list equality alone ignores the key: its epoch, position and padding mark). As in the core machine,
the live iterator under way at a save is the one the twin's first ``iter`` stands for; an iterator
that saw its end has no twin: the twin's pass is the live sampler's next ``iter``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from stateful_sampler import PackedRows, TokenBudgetBatches
from stateful_sampler.packing.base import RowSampler
from tests.core.test_twin_sampler import SamplerTwins
from tests.helpers import scaled_examples
from tests.twin_helpers import outcome

EXAMPLES = int(os.environ.get("TWIN_PACKING_EXAMPLES", "300"))


class KeyedView:
    """A row sampler whose iterators yield ``(items, key)``, so that the machine compares keys too;
    every other call goes to the sampler itself."""

    def __init__(self, sampler: RowSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        return ((list(item), item.key) for item in iter(self.sampler))

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


@dataclass(frozen=True)
class RowConfig:
    """Everything that builds one rank's row sampler (the machine reads ``batch_size`` and ``ranks``)."""

    kind: str  # "split", "whole" or "budget"
    lengths: tuple[int, ...]
    window: int
    tail: str
    world_size: int
    batch_size: int | None

    def sampler(self, rank: int) -> KeyedView:
        common = {"window": self.window, "num_replicas": self.world_size, "rank": rank, "seed": 9, "tail": self.tail}
        if self.kind == "budget":
            return KeyedView(TokenBudgetBatches(list(self.lengths), 40, **common))
        split = self.kind == "split"
        return KeyedView(PackedRows(list(self.lengths), 24, split_records=split, batch_size=self.batch_size, **common))

    def ranks(self) -> list[KeyedView]:
        return [self.sampler(rank) for rank in range(self.world_size)]


@st.composite
def row_configs(draw: Any) -> RowConfig:
    kind = draw(st.sampled_from(["split", "whole", "budget"]))
    # carry needs passes of one length: split rows only (whole packing varies its row count by epoch)
    tail = draw(st.sampled_from(["pad", "drop", "uneven", "carry"] if kind == "split" else ["pad", "drop", "uneven"]))
    batch = draw(st.integers(1, 3))
    if kind == "budget":
        batch_size: int | None = 1  # one item is one batch
    else:
        batch_size = batch if tail == "carry" else draw(st.sampled_from([None, batch]))
    lengths = tuple(draw(st.lists(st.integers(1, 20), min_size=1, max_size=30)))
    return RowConfig(kind, lengths, draw(st.integers(1, 12)), tail, draw(st.integers(1, 3)), batch_size)


class RowTwins(SamplerTwins):
    @initialize(data=st.data())
    def build(self, data: Any) -> None:
        config: RowConfig = data.draw(row_configs(), label="config")
        self.config = config  # type: ignore[assignment]
        built = outcome(config.ranks)
        if built[0] == "raised":  # refused at construction (drop on more ranks than rows)
            assert built[1] == "ValueError", built
        assume(built[0] == "ok")
        self.live = built[1]
        self.twin = None
        self.slots = []
        self.serial = 0
        self.log = []


RowTwins.TestCase.settings = settings(max_examples=scaled_examples(EXAMPLES), stateful_step_count=25, deadline=None)
test_a_restored_row_sampler_behaves_as_the_live_one_for_every_later_call = RowTwins.TestCase
