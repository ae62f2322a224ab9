"""``PackedRows``: a stateful sampler of packed rows of ``seq_len`` tokens, exactly resumable in O(window).

Pre-training (``split_records=True``) concatenates each epoch's shuffled records and cuts the stream
every ``seq_len`` tokens; fine-tuning (``split_records=False``) packs whole records into rows inside
windows of the shuffle. The arithmetic is ``order/rows.py``; this is the sampler around it.
"""

from __future__ import annotations

from typing import Any

from stateful_sampler.checks import check_bool
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.rows import Slice
from stateful_sampler.packing.base import (
    DEFAULT_WINDOW,
    KeyedList,
    RowSampler,
    checked_rows,
    row_order,
    strategy_settings,
)


class RowPlan(KeyedList):
    """A row: ``(record, start, stop)`` token slices adding up to at most ``seq_len`` tokens, and its
    ``SampleKey`` (``key.index`` is the row, ``key.is_padding`` marks a repeat that evens out ranks)."""


class PackedRows(RowSampler):
    """Yields row plans: each epoch's records packed into rows of ``seq_len`` tokens, this rank's share.

    Args:
        lengths: tokens per record (each at least 1); N is its length.
        seq_len: tokens per row.
        split_records: ``True``: concatenate and cut (every token of every record once per epoch, the
            last row may be short); ``False``: each record whole in one row, best-fit decreasing inside
            windows of the shuffle.
        window: shuffle positions per window (the unit of packing and of resume cost).
        truncate: with ``split_records=False``, keep the first ``seq_len`` tokens of a longer record
            instead of refusing it.
        strategy: the order whose draws are packed (``Uniform()`` by default: the rows of earlier releases;
            ``Weighted``, ``Mixture``, ``Curriculum``, ``Stratified`` ...): epoch e packs
            ``strategy``'s pass e as a ``StatefulSampler`` with the same seed reads it; a record drawn twice
            is packed twice.
        seed, num_replicas, rank, tail, batch_size: as ``StatefulSampler`` (``batch_size``: rows per
            batch, needed by ``ResumableLoader``).

    Example:
        >>> rows = PackedRows([5, 3, 8, 2], seq_len=6, seed=1)
        >>> plans = list(rows)
        >>> sum(stop - start for plan in plans for _, start, stop in plan)
        18
    """

    def __init__(
        self,
        lengths: Any,
        seq_len: int,
        *,
        split_records: bool = True,
        window: int = DEFAULT_WINDOW,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        tail: str = "pad",
        batch_size: int | None = None,
        truncate: bool = False,
        strategy: Any = None,
    ) -> None:
        self.split_records = check_bool("split_records", split_records)
        check_bool("truncate", truncate)
        if truncate and split_records:
            raise ValueError("truncate=True applies to split_records=False only: split rows never exceed seq_len")
        order = row_order(
            lengths,
            "seq_len",
            seq_len,
            seed=seed,
            window=window,
            name="packed-rows" if split_records else "packed-whole-rows",
            longer=None if split_records or truncate else "pass truncate=True to keep its first seq_len tokens",
            split=split_records,
            truncate=truncate,
            strategy=strategy,
        )
        self.seq_len = order.capacity
        super().__init__(order, num_replicas=num_replicas, rank=rank, tail=tail, batch_size=batch_size)

    def _settings(self) -> dict[str, Any]:
        order = self.strategy
        return {
            "seq_len": self.seq_len,
            "split_records": self.split_records,
            "window": order.window,
            "truncate": order.truncate,
            "lengths": order.digest[:16],
            **strategy_settings(self.strategy),
        }

    def _item(self, key: SampleKey) -> RowPlan:
        return RowPlan(self.strategy.rows(key.epoch).row(key.index), key)

    def plan(self, epoch: int, row: int) -> list[Slice]:
        """Row ``row`` of ``epoch`` (over all ranks), without moving the cursor; ``IndexError`` for a row the
        epoch does not have (``rows_in_epoch(epoch)`` rows)."""
        return checked_rows(self.strategy, epoch, row, name="row", unit="rows").row(row)
