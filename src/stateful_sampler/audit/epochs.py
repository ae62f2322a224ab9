"""Counting one epoch: what was fed, what was repeated, what was cut and where."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.audit.feed import EpochFeed
from stateful_sampler.audit.report import Duplicate, EpochReport, Occurrence, RankBatches


@dataclass(frozen=True)
class EpochRecords:
    """Per record, for the run-wide figures and the picture."""

    occurrences: np.ndarray  # times fed
    padded: np.ndarray  # bool: fed or cut as a padding repeat
    dropped: np.ndarray  # bool: the tail policy or drop_last cut an occurrence of it


def count_epoch(feed: EpochFeed, size: int, batch_size: int) -> tuple[EpochReport, EpochRecords]:
    fed = feed.fed_records()
    occurrences = np.bincount(fed, minlength=size)
    fed_padding = np.concatenate([rank.padding[: rank.fed] for rank in feed.ranks])
    padding_occurrences = np.bincount(fed[fed_padding], minlength=size)
    repeated = np.flatnonzero(occurrences > 1)
    cut = tuple(
        Occurrence(rank=rank_index, record=int(record), is_padding=bool(padding))
        for rank_index, rank in enumerate(feed.ranks)
        for record, padding in zip(rank.records[rank.fed :].tolist(), rank.padding[rank.fed :].tolist())
    )
    ranks = tuple(
        RankBatches(
            rank=rank_index,
            samples=len(rank.records),
            batches=rank.batches,
            last_batch_size=int(rank.batch_sizes[-1]) if rank.batches else 0,
        )
        for rank_index, rank in enumerate(feed.ranks)
    )
    carried_in = np.concatenate([rank.records[rank.carried_in] for rank in feed.ranks])
    distinct = int(np.count_nonzero(occurrences))
    report = EpochReport(
        epoch=feed.epoch,
        occurrences=len(fed),
        distinct=distinct,
        padding=int(np.count_nonzero(fed_padding)),
        duplicates=tuple(
            Duplicate(
                record=int(record), occurrences=int(occurrences[record]), padding=int(padding_occurrences[record])
            )
            for record in repeated
        ),
        dropped_by_tail=feed.dropped_by_tail,
        dropped_by_batch=cut,
        ranks=ranks,
        equal_steps=len({rank.batches for rank in ranks}) <= 1,
        short_batches=tuple(rank.rank for rank in ranks if 0 < rank.last_batch_size < batch_size),
        single_sample_batches=tuple(rank.rank for rank in ranks if rank.last_batch_size == 1),
        carried_in=tuple(sorted(set(carried_in.tolist()))),
        carried_over=feed.carried_over,
        unseen=size - distinct,
    )
    all_padding = np.concatenate([rank.records[rank.padding] for rank in feed.ranks])
    dropped = np.zeros(size, dtype=bool)
    dropped[list(feed.dropped_by_tail)] = True
    dropped[[occurrence.record for occurrence in cut]] = True
    padded = np.zeros(size, dtype=bool)
    padded[all_padding] = True
    compact = occurrences.astype(np.min_scalar_type(int(occurrences.max(initial=0))))  # held for every epoch
    return report, EpochRecords(occurrences=compact, padded=padded, dropped=dropped)
