"""``audit``: what each epoch really feeds the model, counted from the sampler's own order."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stateful_sampler.audit.composition import FIRST_BATCHES, Labels, compose
from stateful_sampler.audit.epochs import EpochRecords, count_epoch
from stateful_sampler.audit.feed import epoch_feed
from stateful_sampler.audit.mates import FedBatches, count_mates, plan_sample, sample_note, summarise
from stateful_sampler.audit.report import AuditReport, AuditSettings, EpochComposition, EpochReport, RecordCounts
from stateful_sampler.audit.setup import rank_samplers
from stateful_sampler.checks import check_int
from stateful_sampler.packing.base import RowSampler


def audit(
    sampler_or_config: Any,
    *,
    epochs: int = 1,
    batch_size: int | None = None,
    drop_last: bool = False,
    num_workers: int = 0,
    start_epoch: int = 0,
    labels: Any = None,
    target: Mapping[int, float] | None = None,
    first_batches: int = FIRST_BATCHES,
    before: Callable[[int], None] | None = None,
) -> AuditReport:
    """Audit ``epochs`` epochs from ``start_epoch`` of a ``StatefulSampler`` (its world size, its
    loaded state) or of an ``AuditConfig``, fed through per-rank loaders of ``batch_size``.

    ``batch_size`` defaults to the sampler's; ``drop_last`` is the loader's batch-level flag.
    ``num_workers`` is recorded only: workers load batches the main process formed, so no count
    depends on it. Counts are exact; batch-mate diversity is exact up to ``mates.PAIR_LIMIT``
    (record, mate) pairs and measured on a stated uniform sample of records beyond.

    ``labels`` (one class, group or band id per record) adds each epoch's batch composition against
    ``target`` (a share per class; default: the labels' own distribution), the pooled composition of
    the first ``first_batches`` steps, and a chi-square test of the epoch's class counts.

    ``before``, when given, is called with the number of occurrences to be fed once the arguments
    are checked and before the work starts (the command line prints its estimate from it).
    """
    if isinstance(sampler_or_config, RowSampler):
        raise TypeError(
            f"audit counts records per batch; a {type(sampler_or_config).__name__} yields rows: use "
            f"stateful_sampler.audit.audit_packing(sampler) for its packing efficiency per epoch"
        )
    settings, samplers, occurrences = rank_samplers(
        sampler_or_config,
        batch_size=batch_size,
        drop_last=drop_last,
        num_workers=num_workers,
        start_epoch=start_epoch,
        epochs=epochs,
    )
    classes = None if labels is None else Labels.build(labels, settings.size, target)
    first_batches = check_int("first_batches", first_batches, minimum=1)
    if before is not None:
        before(occurrences)
    compositions: list[tuple[EpochComposition, np.ndarray]] = []
    reports: list[EpochReport] = []
    rows: list[EpochRecords] = []
    fed: list[FedBatches] = []
    for epoch in range(settings.start_epoch, settings.start_epoch + settings.epochs):
        feed = epoch_feed(samplers, epoch, settings.batch_size, settings.drop_last)
        report, records = count_epoch(feed, settings.size, settings.batch_size)
        reports.append(report)
        rows.append(records)
        compact = feed.fed_records().astype(np.min_scalar_type(max(settings.size - 1, 0)))  # held until the end
        fed.append(FedBatches(compact, feed.batch_sizes()))
        if classes is not None:
            compositions.append(compose(feed, classes, first_batches))
    return _report(settings, reports, rows, fed, compositions)


def _report(
    settings: AuditSettings,
    reports: list[EpochReport],
    rows: list[EpochRecords],
    fed: list[FedBatches],
    compositions: list[tuple[EpochComposition, np.ndarray]],
) -> AuditReport:
    size = settings.size
    occurrences = np.stack([row.occurrences for row in rows])
    total = occurrences.sum(axis=0, dtype=np.int64)
    seen = np.zeros(size, dtype=bool)
    cumulative = []
    for row in rows:
        seen |= row.occurrences > 0
        cumulative.append(int(np.count_nonzero(seen)))
    pairs = sum(epoch.pairs for epoch in fed)
    measured = plan_sample(size, pairs)
    mates = count_mates(size, fed, measured)
    batch_mates = summarise(size, measured, mates) if len(measured) else None
    per_record_mates = np.full(size, -1, dtype=np.int64)
    per_record_mates[measured] = mates
    return AuditReport(
        settings=settings,
        epochs=tuple(reports),
        cumulative_distinct=tuple(cumulative),
        never_seen=tuple(np.flatnonzero(total == 0).tolist()),
        occurrences_min=int(total.min()) if size else 0,
        occurrences_max=int(total.max()) if size else 0,
        occurrence_histogram={int(k): int(v) for k, v in enumerate(np.bincount(total)) if v},
        occurrences_per_pass=float(np.mean([report.occurrences for report in reports])),
        distinct_per_pass=float(np.mean([report.distinct for report in reports])),
        batch_mates=batch_mates,
        warnings=_warnings(settings, reports, total),
        limits=sample_note(size, pairs, len(measured)),
        counts=RecordCounts(
            occurrences=occurrences,
            padded=np.stack([row.padded for row in rows]),
            dropped=np.stack([row.dropped for row in rows]),
            mates=per_record_mates,
            composition=tuple(steps for _, steps in compositions),
        ),
        composition=tuple(report for report, _ in compositions),
    )


def _warnings(settings: AuditSettings, reports: list[EpochReport], total: np.ndarray) -> tuple[str, ...]:
    """The findings that cost a run: a hang, a crash, or data the model never sees."""
    found = []
    sampler_batch = settings.sampler_batch_size
    if sampler_batch != settings.batch_size and (sampler_batch is not None or settings.tail == "carry"):
        found.append(
            f"the sampler's batch_size={sampler_batch} differs from the loader's batch_size={settings.batch_size}: "
            "consumed-batch positions and carry's epoch boundaries follow the sampler's"
        )
    for report in reports:
        if not report.equal_steps:
            steps = ", ".join(f"rank {rank.rank}: {rank.batches}" for rank in report.ranks)
            found.append(f"epoch {report.epoch}: ranks take unequal step counts ({steps}); DDP hangs at the end")
        if report.single_sample_batches:
            found.append(
                f"epoch {report.epoch}: a batch of 1 sample on rank(s) {_ranks(report.single_sample_batches)}; "
                "BatchNorm in training mode fails on it: use drop_last=True or another batch size"
            )
    unseen = int(np.count_nonzero(total == 0))
    if unseen:
        found.append(f"{unseen} of {settings.size} records are never fed in the audited epochs")
    return tuple(found)


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(rank) for rank in ranks)
