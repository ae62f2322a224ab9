"""``PackedDataset``: turns the row plans of ``PackedRows`` into what a model takes.

A row is the concatenation of its slices. ``position_ids`` restart at 0 with each slice and
``labels`` are ``-100`` at each slice's first token, so no token learns from another document
across a boundary (as HF's ``DataCollatorWithFlattening``); a padding row (a repeat that evens out
the ranks) has every label ``-100``. ``collate`` stacks rows to ``seq_len`` and gives
``cu_seqlens`` for flash-attention's varlen kernels, or a block-diagonal causal ``attention_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stateful_sampler.checks import check_choice, check_int
from stateful_sampler.packing.rows import PackedRows, RowPlan

IGNORE = -100  # the label the loss skips (torch's and HF's default ignore_index)


class Attention(str, Enum):
    VARLEN = "varlen"  # cu_seqlens over the flattened batch (flash_attn_varlen_func)
    MASK = "mask"  # a (batch, seq_len, seq_len) boolean mask: True where a token may attend


class PackedDataset(Dataset):
    """Loads a row plan's slices from ``dataset`` (each record a 1-D sequence of token ids, or a dict
    with ``input_ids``) and concatenates them.

    Args:
        dataset: a map-style dataset of token sequences, one per record of ``rows``.
        rows: the sampler whose plans this dataset reads; its ``seq_len`` is the collated width, and
            the dataset must have one record per length it packs.
        attention: ``"varlen"`` (``cu_seqlens``) or ``"mask"``.
        pad_id: the token that fills a row up to ``seq_len``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> documents = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
        >>> rows = PackedRows([3, 2, 4], seq_len=4, batch_size=2)
        >>> packed = PackedDataset(documents, rows)
        >>> batch = next(iter(DataLoader(packed, sampler=rows, batch_size=2, collate_fn=packed.collate)))
        >>> batch["input_ids"].shape
        torch.Size([2, 4])
    """

    def __init__(self, dataset: Any, rows: PackedRows, *, attention: str = "varlen", pad_id: int = 0) -> None:
        if not isinstance(rows, PackedRows):
            raise TypeError(
                f"rows must be the PackedRows sampler whose plans this dataset reads, got {type(rows).__name__}"
            )
        if len(dataset) != rows.size:
            raise ValueError(
                f"lengths must have one entry per record of the dataset: the dataset has {len(dataset)} records, "
                f"PackedRows was given {rows.size} lengths"
            )
        self.dataset = dataset
        self.seq_len = rows.seq_len
        self.lengths = rows.strategy.lengths
        self.attention = check_choice("attention", attention, Attention)
        self.pad_id = check_int("pad_id", pad_id)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, plan: RowPlan) -> dict[str, Any]:
        if not isinstance(plan, RowPlan):
            raise TypeError(
                f"PackedDataset expects a RowPlan, got {type(plan).__name__} {plan!r}: pass the PackedRows as "
                f"DataLoader(packed, sampler=rows, batch_size=B, collate_fn=packed.collate)"
            )
        pieces, positions, labels = [], [], []
        for record, start, stop in plan:
            tokens = self._tokens(record)
            piece = tokens[start:stop]
            pieces.append(piece)
            positions.append(torch.arange(stop - start, dtype=torch.long))
            label = piece.clone()
            label[0] = IGNORE
            labels.append(label)
        input_ids = torch.cat(pieces)
        label_ids = torch.cat(labels)
        if plan.is_padding:
            label_ids.fill_(IGNORE)
        return {
            "input_ids": input_ids,
            "labels": label_ids,
            "position_ids": torch.cat(positions),
            "seq_lens": [stop - start for _, start, stop in plan],
            "is_padding": plan.is_padding,
            "row": plan.key.index,
            "epoch": plan.key.epoch,
        }

    def _tokens(self, record: int) -> torch.Tensor:
        item = self.dataset[record]
        if isinstance(item, dict):
            item = item["input_ids"]
        tokens = torch.as_tensor(np.asarray(item), dtype=torch.long).reshape(-1)
        if len(tokens) != int(self.lengths[record]):
            raise ValueError(
                f"lengths[{record}] is {int(self.lengths[record])} but record {record} of the dataset has "
                f"{len(tokens)} tokens: the lengths must be the dataset's own"
            )
        return tokens

    def collate(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Stack rows to ``seq_len``: ``input_ids``, ``labels``, ``position_ids`` (batch, seq_len),
        ``is_padding`` (batch,), and ``cu_seqlens`` / ``max_seqlen`` over the flattened batch (each row's
        fill is a segment of its own) or ``attention_mask`` (batch, seq_len, seq_len)."""
        width = self.seq_len
        count = len(rows)
        input_ids = torch.full((count, width), self.pad_id, dtype=torch.long)
        labels = torch.full((count, width), IGNORE, dtype=torch.long)
        position_ids = torch.zeros((count, width), dtype=torch.long)
        lengths: list[int] = []
        for at, row in enumerate(rows):
            used = len(row["input_ids"])
            input_ids[at, :used] = row["input_ids"]
            labels[at, :used] = row["labels"]
            position_ids[at, :used] = row["position_ids"]
            lengths += row["seq_lens"] + ([width - used] if used < width else [])
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "is_padding": torch.tensor([row["is_padding"] for row in rows], dtype=torch.bool),
            "rows": torch.tensor([row["row"] for row in rows], dtype=torch.long),
            "epochs": torch.tensor([row["epoch"] for row in rows], dtype=torch.long),
        }
        if self.attention is Attention.VARLEN:
            batch["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
            batch["max_seqlen"] = max(lengths)
        else:
            batch["attention_mask"] = torch.stack([_block_causal(row["seq_lens"], width) for row in rows])
        return batch


def _block_causal(seq_lens: list[int], width: int) -> torch.Tensor:
    """True where token i may attend to token j: j <= i inside the same slice (fill tokens see themselves)."""
    segment = torch.full((width,), -1, dtype=torch.long)
    start = 0
    for number, length in enumerate(seq_lens):
        segment[start : start + length] = number
        start += length
    fill = segment < 0
    segment[fill] = torch.arange(int(fill.sum())) + len(seq_lens)  # each fill token its own segment
    same = segment[:, None] == segment[None, :]
    return same & torch.ones((width, width), dtype=torch.bool).tril()
