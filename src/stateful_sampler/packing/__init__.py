"""Packing: samplers over rows of packed records (``PackedRows``), token-budget batches (``TokenBudgetBatches``),
and the dataset that turns row plans into tensors (``PackedDataset``). The pure row math is ``order/rows.py``."""

from stateful_sampler.packing.base import DEFAULT_WINDOW, KeyedList, RowSampler
from stateful_sampler.packing.budget import Batch, TokenBudgetBatches
from stateful_sampler.packing.dataset import Attention, PackedDataset
from stateful_sampler.packing.rows import PackedRows, RowPlan

__all__ = [
    "DEFAULT_WINDOW",
    "Attention",
    "Batch",
    "KeyedList",
    "PackedDataset",
    "PackedRows",
    "RowPlan",
    "RowSampler",
    "TokenBudgetBatches",
]
