"""What each batch is made of: the class (or group, or band) composition of every step, against a target.

A step's batch is what all ranks feed at that step, padding included. The target is a share per
class: by default the dataset's own class distribution (a uniform shuffle or a proportional
stratification aims at it); a strategy that aims elsewhere (weights, a balanced mode) is audited
against its own target. Only labels are needed: the batches come from the same feed as every other
count of the audit, so this is as strategy-agnostic as the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stateful_sampler.audit.chisquare import chi_square
from stateful_sampler.audit.feed import EpochFeed
from stateful_sampler.audit.report import EpochComposition
from stateful_sampler.order.strategy import check_length, id_array

FIRST_BATCHES = 10  # the seed material's check: do the first batches look like the whole?
MAX_CELLS = 1 << 25  # counts per (step, class) of one epoch, 256 MiB: thousands of groups over long epochs exceed it


@dataclass(frozen=True)
class Labels:
    """Each record's class, and the target share of every class present."""

    classes: np.ndarray  # the class ids present, ascending
    of_record: np.ndarray  # index into ``classes`` per record
    target: np.ndarray  # share per class, summing to 1

    @classmethod
    def build(cls, labels: Any, size: int, target: Mapping[int, float] | None) -> Labels:
        ids = id_array("labels", labels)
        check_length("labels", ids, size)
        classes, of_record, counts = np.unique(ids, return_inverse=True, return_counts=True)
        if target is None:
            shares = counts / max(size, 1)
        else:
            unknown = sorted(set(target) - set(classes.tolist()))
            if unknown:
                raise ValueError(f"target names classes with no labelled record: {unknown[:10]}")
            shares = np.array([float(target.get(int(c), 0.0)) for c in classes])
            if not np.all(np.isfinite(shares)) or np.any(shares < 0) or not shares.sum() > 0:
                raise ValueError(
                    f"target must give finite, non-negative shares with a positive sum, got {dict(target)}"
                )
            shares = shares / shares.sum()
        return cls(classes, of_record.reshape(-1), shares)


def compose(feed: EpochFeed, labels: Labels, first_batches: int = FIRST_BATCHES) -> tuple[EpochComposition, np.ndarray]:
    """The epoch's composition report and its counts per step and class (steps x classes)."""
    width = len(labels.classes)
    steps = max((rank.batches for rank in feed.ranks), default=0)
    if steps * width > MAX_CELLS:
        raise ValueError(
            f"labels has {width} classes over {steps} steps in epoch {feed.epoch}: {steps * width} counts, more than "
            f"the {MAX_CELLS} the composition holds; give labels fewer classes (e.g. group ids folded into bins)"
        )
    per_step = np.zeros(steps * width, dtype=np.int64)
    for rank in feed.ranks:
        step = np.arange(rank.fed, dtype=np.int64) // rank.batch_size
        per_step += np.bincount(step * width + labels.of_record[rank.records[: rank.fed]], minlength=steps * width)
    counts = per_step.reshape(steps, width)
    sizes = counts.sum(axis=1, keepdims=True)
    deviation = np.abs(counts / np.maximum(sizes, 1) - labels.target)
    deviation[sizes[:, 0] == 0] = 0.0
    worst = int(deviation.max(axis=1).argmax()) if steps else -1
    first = min(first_batches, steps)
    pooled = counts[:first].sum(axis=0)
    fed = counts.sum(axis=0)
    statistic, freedom, p_value = chi_square(fed.astype(np.float64), labels.target)
    report = EpochComposition(
        epoch=feed.epoch,
        classes=tuple(labels.classes.tolist()),
        target=tuple(labels.target.tolist()),
        fed=tuple(fed.tolist()),
        steps=steps,
        max_step_deviation=float(deviation[worst].max()) if steps else 0.0,
        worst_step=worst,
        first_steps=first,
        first_steps_deviation=float(np.abs(pooled / max(pooled.sum(), 1) - labels.target).max()) if first else 0.0,
        chi_square=statistic,
        degrees_of_freedom=freedom,
        p_value=p_value,
    )
    return report, counts
