"""``TokenBudgetBatches``: a stateful batch sampler of whole records under a token budget (fairseq's
``batch_by_size``), exactly resumable in O(window).

Batches are the bins of ``order/packing.py`` over windows of each epoch's shuffle: pure in (seed,
epoch), whatever the ranks. Ranks stride through the epoch's batches, one batch per rank per step;
with the default ``tail="pad"`` the last step is evened out by repeating the epoch's first batches on
the ranks that would have none, marked ``is_padding`` (``tail="drop"`` cuts the last partial step).
"""

from __future__ import annotations

from typing import Any

from stateful_sampler.checks import check_bool
from stateful_sampler.keys import SampleKey
from stateful_sampler.packing.base import (
    DEFAULT_WINDOW,
    KeyedList,
    RowSampler,
    checked_rows,
    row_order,
    strategy_settings,
)


class Batch(KeyedList):
    """One batch's records (or their ``SampleKey`` s with ``yield_keys=True``) and the batch's own key:
    ``key.index`` is the batch within the epoch, ``key.is_padding`` marks a repeat that evens out ranks."""


class TokenBudgetBatches(RowSampler):
    """Yields this rank's batches of record indices, each costing at most ``max_tokens``.

    Args:
        lengths: tokens per record (each at least 1).
        max_tokens: the budget of a batch.
        padded: cost = longest record x count (a padded batch); ``False``: the token sum (packed,
            padding-free attention).
        window: shuffle positions per window; batches are packed inside one window.
        yield_keys: batches of ``SampleKey`` s (for ``KeyedDataset``) instead of indices.
        strategy: the order whose draws are packed (``Uniform()`` by default: the rows of earlier releases;
            ``Weighted``, ``Mixture``, ``Curriculum``, ``Stratified`` ...): epoch e packs
            ``strategy``'s pass e as a ``StatefulSampler`` with the same seed reads it; a record drawn twice
            is packed twice.
        seed, num_replicas, rank, tail: as ``StatefulSampler``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> batches = TokenBudgetBatches([5, 3, 8, 2, 7], max_tokens=10, seed=1)
        >>> loader = DataLoader(range(5), batch_sampler=batches)
        >>> sorted(int(i) for batch in loader for i in batch)
        [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        lengths: Any,
        max_tokens: int,
        *,
        padded: bool = True,
        window: int = DEFAULT_WINDOW,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        tail: str = "pad",
        yield_keys: bool = False,
        strategy: Any = None,
    ) -> None:
        self.padded = check_bool("padded", padded)
        self.keyed = check_bool("yield_keys", yield_keys)
        order = row_order(
            lengths,
            "max_tokens",
            max_tokens,
            seed=seed,
            window=window,
            name="token-budget",
            longer="every batch holds whole records: raise max_tokens",
            padded=self.padded,
            strategy=strategy,
        )
        self.max_tokens = order.capacity
        # one item is one batch: ResumableLoader counts batches as items
        super().__init__(order, num_replicas=num_replicas, rank=rank, tail=tail, batch_size=1)

    def _settings(self) -> dict[str, Any]:
        order = self.strategy
        return {
            "max_tokens": self.max_tokens,
            "padded": self.padded,
            "window": order.window,
            "lengths": order.digest[:16],
            **strategy_settings(self.strategy),
        }

    def _item(self, key: SampleKey) -> Batch:
        records = self.strategy.rows(key.epoch).batch(key.index)
        if not self.keyed:
            return Batch(records, key)
        return Batch([SampleKey(record, key.seed, key.epoch, key.position, key.is_padding) for record in records], key)

    def batch(self, epoch: int, index: int) -> list[int]:
        """Batch ``index`` of ``epoch`` (over all ranks), without moving the cursor; ``IndexError`` for a batch
        the epoch does not have (``rows_in_epoch(epoch)`` batches)."""
        return checked_rows(self.strategy, epoch, index, name="index", unit="batches").batch(index)
