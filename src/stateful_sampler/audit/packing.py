"""The packing audit: per epoch, how full the rows (or token-budget batches) of a row sampler are.

Counted from the sampler's own arithmetic over every rank and the whole epoch: every global position of
the epoch's layout (its padding repeats included, since they cost a step), each row's slices or batch
records. A sampler partly drawn, or resumed from a state, answers for the whole epoch too: the rows before
its position were fed by the ranks that drew them, the rest by its own ranks (``segment_start`` says where
that is, ``remaining_steps`` what each rank takes from there). Packing efficiency is real tokens /
(capacity x rows fed): what a training step pays for and does not use, be it the unfilled end of a row, a
padding row that evens out the ranks, or (padded batches) the padding up to a batch's longest record.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.checks import check_int
from stateful_sampler.packing.base import RowSampler


@dataclass(frozen=True)
class PackingEpoch:
    epoch: int
    rows: int  # rows (batches) of the epoch, over all ranks, padding excluded
    padding_rows: int  # repeats that even out the ranks' steps
    tokens: int  # real tokens in the rows that are not padding
    cost: int  # what the non-padding rows cost: their tokens, or longest x count for padded batches
    capacity: int  # seq_len, or max_tokens
    steps: tuple[int, ...]  # rows (batches) per rank over the whole epoch, as each rank's len() counts them
    segment_start: int = 0  # the epoch's position where these ranks' layout starts (a resume's, a partial draw's)
    remaining_steps: tuple[int, ...] = ()  # rows (batches) per rank from segment_start on: what each still steps

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
                f"packing efficiency {self.efficiency:.2%} (fill {self.fill:.2%}{padded}), {self._steps()}")  # fmt: skip

    def _steps(self) -> str:
        if len(set(self.steps)) <= 1:
            return f"steps per rank equal ({self.steps[0] if self.steps else 0})"
        rest = self.remaining_steps
        if self.segment_start and len(set(rest)) == 1:
            return (f"steps per rank equal from row {self.segment_start} on ({rest[0]} each; {list(self.steps)} over "
                    f"the epoch, counting the rows before it as these ranks would have taken them)")  # fmt: skip
        return f"steps per rank UNEQUAL ({list(self.steps)})"


def audit_packing(sampler: RowSampler, *, epochs: int = 1, start_epoch: int = 0) -> tuple[PackingEpoch, ...]:
    """Packing efficiency of ``epochs`` whole epochs from ``start_epoch`` of a ``PackedRows`` or
    ``TokenBudgetBatches`` on its world size, laid out as the sampler lays them out: the current epoch
    as it is drawn (partly drawn, or resumed from a state on other ranks), the others from their starts.

    Example:
        >>> from stateful_sampler import PackedRows
        >>> epoch = audit_packing(PackedRows([5, 3, 8, 2], seq_len=6, num_replicas=2, rank=0))[0]
        >>> (epoch.rows, epoch.padding_rows, epoch.tokens, epoch.steps)
        (3, 1, 18, (2, 2))
    """
    if not isinstance(sampler, RowSampler):
        raise TypeError(f"audit_packing needs a PackedRows or TokenBudgetBatches, got {type(sampler).__name__}")
    epochs = check_int("epochs", epochs, minimum=1)
    start_epoch = check_int("start_epoch", start_epoch)
    order = sampler.strategy
    lengths = order.lengths
    found = []
    for epoch in range(start_epoch, start_epoch + epochs):
        layout = sampler.layout(epoch)
        count = order.rows(epoch).count()
        positions = np.arange(layout.length, dtype=np.int64)  # the whole epoch, the part drawn before included
        padding = layout.is_padding(positions)
        tokens = cost = 0
        for offset in layout.pass_offsets(positions[~padding]).tolist():
            passes, row = divmod(offset, count)  # carry's first rows are the end of the pass before
            rows = order.rows(epoch + passes)
            if order.split:
                used = sum(stop - start for _, start, stop in rows.row(row))
                tokens, cost = tokens + used, cost + used
                continue
            chosen = lengths[rows.batch(row)]
            if order.truncate:
                chosen = np.minimum(chosen, order.capacity)
            tokens += int(chosen.sum())
            cost += int(chosen.max()) * len(chosen) if order.padded else int(chosen.sum())
        ranks = range(layout.world_size)
        rest = tuple(layout.local_length(rank) for rank in ranks)
        steps = tuple(layout.local_before(rank) + rest[rank] for rank in ranks)
        real = int((~padding).sum())
        found.append(
            PackingEpoch(
                epoch, real, len(positions) - real, tokens, cost, order.capacity, steps, layout.segment_start, rest
            )
        )
    return tuple(found)
