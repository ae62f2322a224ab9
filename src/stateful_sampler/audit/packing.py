"""The packing audit: per epoch, how full the rows (or token-budget batches) of a row sampler are.

Counted from the sampler's own arithmetic over every rank: each rank's share of the epoch's layout
(its padding repeats included, since they cost a step), each row's slices or batch records. Packing
efficiency is real tokens / (capacity x rows fed): what a training step pays for and does not use,
be it the unfilled end of a row, a padding row that evens out the ranks, or (padded batches) the
padding up to a batch's longest record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.checks import check_int
from stateful_sampler.row_sampler import RowSampler


@dataclass(frozen=True)
class PackingEpoch:
    epoch: int
    rows: int  # rows (batches) of the epoch, over all ranks, padding excluded
    padding_rows: int  # repeats that even out the ranks' steps
    tokens: int  # real tokens in the rows that are not padding
    cost: int  # what the non-padding rows cost: their tokens, or longest x count for padded batches
    capacity: int  # seq_len, or max_tokens
    steps: tuple[int, ...]  # rows (batches) per rank

    @property
    def efficiency(self) -> float:
        """Real tokens / (capacity x every row fed, padding rows included)."""
        fed = self.rows + self.padding_rows
        return self.tokens / (self.capacity * fed) if fed else 0.0

    @property
    def fill(self) -> float:
        """Real tokens / (capacity x rows): the packing rule's own fill, before the ranks are evened out."""
        return self.tokens / (self.capacity * self.rows) if self.rows else 0.0

    def summary(self) -> str:
        padded = f", padding within batches {1 - self.tokens / self.cost:.2%}" if self.cost != self.tokens else ""
        return (f"epoch {self.epoch}: {self.rows} rows + {self.padding_rows} padding rows of {self.capacity}, "
                f"packing efficiency {self.efficiency:.2%} (fill {self.fill:.2%}{padded}), steps per rank "
                f"{'equal' if len(set(self.steps)) <= 1 else 'UNEQUAL'} ({self.steps[0] if self.steps else 0})")  # fmt: skip


def audit_packing(sampler: RowSampler, *, epochs: int = 1, start_epoch: int = 0) -> tuple[PackingEpoch, ...]:
    """Packing efficiency of ``epochs`` epochs from ``start_epoch`` of a ``PackedRows`` or
    ``TokenBudgetBatches`` on its world size, from epoch starts (a loaded state's epoch included)."""
    if not isinstance(sampler, RowSampler):
        raise TypeError(f"audit_packing needs a PackedRows or TokenBudgetBatches, got {type(sampler).__name__}")
    epochs = check_int("epochs", epochs, minimum=1)
    start_epoch = check_int("start_epoch", start_epoch)
    order = sampler.strategy
    lengths = order.lengths
    found = []
    for epoch in range(start_epoch, start_epoch + epochs):
        layout = sampler.layout(epoch)
        rows = order.rows(epoch)
        positions = np.arange(layout.segment_start, layout.length, dtype=np.int64)
        padding = layout.is_padding(positions)
        tokens = cost = 0
        for row in layout.pass_offsets(positions[~padding]).tolist():
            if order.split:
                used = sum(stop - start for _, start, stop in rows.row(row))
                tokens, cost = tokens + used, cost + used
                continue
            chosen = lengths[rows.batch(row)]
            if order.truncate:
                chosen = np.minimum(chosen, order.capacity)
            tokens += int(chosen.sum())
            cost += int(chosen.max()) * len(chosen) if order.padded else int(chosen.sum())
        steps = tuple(layout.local_before(rank) + layout.local_length(rank) for rank in range(layout.world_size))
        found.append(
            PackingEpoch(epoch, int((~padding).sum()), int(padding.sum()), tokens, cost, order.capacity, steps)
        )
    return tuple(found)
