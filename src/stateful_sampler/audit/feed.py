"""One epoch as the ``DataLoader`` of every rank feeds it: the sampler's order cut into batches.

A ``DataLoader`` with a sampler and ``batch_size=B`` groups the sampler's indices, in order, into
runs of B in the main process; with ``drop_last`` it discards a last run shorter than B. Workers
only load the batches they are handed, so the batches do not depend on ``num_workers``
(``tests/audit/test_audit_pipeline.py`` checks this against real worker processes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.order.policies import Tail
from stateful_sampler.sampler import StatefulSampler


@dataclass(frozen=True)
class RankFeed:
    """One rank's indices for the epoch, and how many of them its loader feeds."""

    records: np.ndarray  # the sampler's indices, in order
    padding: np.ndarray  # bool: the occurrence only repeats a record to even out the ranks
    carried_in: np.ndarray  # bool: the occurrence comes from an earlier pass (carry's remainder)
    fed: int  # the first ``fed`` indices are fed; drop_last cuts the rest
    batch_size: int

    @property
    def batches(self) -> int:
        return len(self.batch_sizes)

    @property
    def batch_sizes(self) -> np.ndarray:
        return np.diff(np.append(np.arange(0, self.fed, self.batch_size), self.fed))


@dataclass(frozen=True)
class EpochFeed:
    epoch: int
    ranks: tuple[RankFeed, ...]
    dropped_by_tail: tuple[int, ...]
    carried_over: tuple[int, ...]

    def fed_records(self) -> np.ndarray:
        """The fed records of all ranks, batch after batch."""
        return np.concatenate([rank.records[: rank.fed] for rank in self.ranks])

    def batch_sizes(self) -> np.ndarray:
        """The sizes of the batches in ``fed_records`` order."""
        return np.concatenate([rank.batch_sizes for rank in self.ranks])


def epoch_feed(samplers: list[StatefulSampler], epoch: int, batch_size: int, drop_last: bool) -> EpochFeed:
    ranks = tuple(_rank_feed(sampler, epoch, batch_size, drop_last) for sampler in samplers)
    template = samplers[0]
    return EpochFeed(
        epoch=epoch,
        ranks=ranks,
        dropped_by_tail=tuple(sorted(template.dropped_indices(epoch))),
        carried_over=_carried_over(template, epoch),
    )


def _rank_feed(sampler: StatefulSampler, epoch: int, batch_size: int, drop_last: bool) -> RankFeed:
    layout = sampler.layout(epoch)
    records = sampler.indices(epoch)
    positions = layout.global_positions(sampler.rank, 0, len(records))
    fed = len(records) - len(records) % batch_size if drop_last else len(records)
    return RankFeed(
        records=records,
        padding=layout.is_padding(positions),
        carried_in=layout.pass_offsets(positions) < 0,
        fed=fed,
        batch_size=batch_size,
    )


def _carried_over(sampler: StatefulSampler, epoch: int) -> tuple[int, ...]:
    """Under ``carry``: the records of the epoch's pass that it leaves to the next epoch."""
    return tuple(sorted(sampler.unused_indices(epoch))) if sampler.tail is Tail.CARRY else ()
