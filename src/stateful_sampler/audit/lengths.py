"""The length audit: how much of each batch is padding, for any order of records with known lengths.

A batch padded to its longest record costs max_len x batch tokens; padding waste is the share of the
tokens that are padding, (sum of (max_len - len)) / (sum of max_len x batch size). Batches are cut as
the sampler cuts them: global batch t is positions [t*B*W, (t+1)*B*W), rank r takes its strided slice
r, r + W, ..., so each rank pads its own batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthAudit:
    padding_waste: float  # padding tokens / total tokens (padded batches), all ranks
    batch_spread: np.ndarray  # per rank batch (step-major, then rank): longest minus shortest length
    rank_spread: float  # mean over steps of (longest rank batch's max length - shortest rank batch's max length)

    def summary(self) -> str:
        return (f"padding waste {self.padding_waste:.2%}, length spread per batch: median "
                f"{np.median(self.batch_spread):.0f}, max {self.batch_spread.max(initial=0):.0f}; "
                f"mean spread of the ranks' longest records per step {self.rank_spread:.1f}")  # fmt: skip


def audit_lengths(lengths: np.ndarray, order: np.ndarray, batch_size: int, world_size: int = 1) -> LengthAudit:
    """Audit one epoch's global ``order`` cut into per-rank batches of ``batch_size`` on ``world_size``
    ranks; a last partial global batch is cut the same way (short batches, as with ``drop_last=False``)."""
    per_record = np.asarray(lengths, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    global_batch = batch_size * world_size
    steps = -(-len(per_record) // global_batch)
    padded = np.full(steps * global_batch, -1, dtype=np.int64)
    padded[: len(per_record)] = per_record
    # [step, position in rank batch, rank]: rank r holds positions r + j*W of the step's global batch
    grid = padded.reshape(steps, batch_size, world_size)
    present = grid >= 0
    longest = grid.max(axis=1)  # per step and rank
    shortest = np.where(present, grid, np.iinfo(np.int64).max).min(axis=1)
    counts = present.sum(axis=1)
    real = counts > 0
    total = int((longest * counts)[real].sum())
    padding = total - int(per_record.sum())
    spread = (longest - shortest)[real]
    rank_max = np.where(real, longest, -1)
    rank_min = np.where(real, longest, np.iinfo(np.int64).max)
    return LengthAudit(
        padding_waste=padding / total if total else 0.0,
        batch_spread=spread,
        rank_spread=float(np.mean(rank_max.max(axis=1) - rank_min.min(axis=1))) if steps else 0.0,
    )
