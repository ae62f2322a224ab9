"""The audit as a readable text table: one row per epoch, then the details that need names."""

from __future__ import annotations

from collections.abc import Iterable

from stateful_sampler.audit.report import AuditReport, EpochReport

_LISTED = 10  # items named before "... and k more"
_RANKS_LISTED = 8  # ranks listed one by one before only the range is shown


def render(report: AuditReport) -> str:
    s = report.settings
    lines = [
        (
            f"Coverage audit: {s.size} records on {s.world_size} rank(s), strategy={s.strategy}, tail={s.tail}, "
            f"order={s.order}, seed={s.seed}, {'shuffled' if s.shuffle else 'not shuffled'}"
        ),
        (
            f"Loader: batch_size={s.batch_size} per rank, drop_last={s.drop_last}, num_workers={s.num_workers} "
            f"(workers change no count); epochs {s.start_epoch}..{s.start_epoch + s.epochs - 1}"
        ),
        "",
    ]
    header = (
        "epoch",
        "fed",
        "distinct",
        "padding",
        "repeated",
        "cut:tail",
        "cut:batch",
        "unseen",
        "steps",
        "last batch",
    )
    rows = [header] + [_row(epoch) for epoch in report.epochs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append("  (fed = occurrences fed to the model, padding included; distinct = records fed at least once)")
    for epoch in report.epochs:
        lines += _details(epoch)
    lines += ["", f"Over {s.epochs} epoch(s):"]
    lines.append(
        f"  per epoch: {report.occurrences_per_pass:.10g} occurrences fed (what examples/s counts), "
        f"{report.distinct_per_pass:.10g} distinct records"
    )
    last = report.cumulative_distinct[-1]
    percent = 100.0 * last / s.size if s.size else 100.0
    lines.append(
        f"  cumulative distinct: {' -> '.join(map(str, report.cumulative_distinct))} of {s.size} ({percent:.1f}%)"
    )
    lines.append(f"  never seen: {_listed(report.never_seen) if report.never_seen else 'none'}")
    histogram = ", ".join(f"{count}x: {records}" for count, records in report.occurrence_histogram.items())
    lines.append(
        f"  occurrences per record: min {report.occurrences_min}, max {report.occurrences_max} "
        f"(times fed: records) {histogram}"
    )
    lines += _mates(report)
    lines += _composition(report)
    if report.warnings:
        lines += ["", "Warnings:"] + [f"  ! {warning}" for warning in report.warnings]
    if report.limits:
        lines += ["", "Limits:"] + [f"  - {limit}" for limit in report.limits]
    return "\n".join(lines) + "\n"


def _row(epoch: EpochReport) -> tuple[str, ...]:
    return (
        str(epoch.epoch),
        str(epoch.occurrences),
        str(epoch.distinct),
        str(epoch.padding),
        str(len(epoch.duplicates)),
        str(len(epoch.dropped_by_tail)),
        str(len(epoch.dropped_by_batch)),
        str(epoch.unseen),
        _steps(epoch),
        _last_batches(epoch),
    )


def _per_rank(values: list[int], separator: str) -> str:
    if len(values) <= _RANKS_LISTED:
        return separator.join(map(str, values))
    return f"{min(values)}..{max(values)}"


def _steps(epoch: EpochReport) -> str:
    steps = [rank.batches for rank in epoch.ranks]
    return str(steps[0]) if epoch.equal_steps else "UNEQUAL " + _per_rank(steps, "/")


def _last_batches(epoch: EpochReport) -> str:
    text = _per_rank([rank.last_batch_size for rank in epoch.ranks], " ")
    if epoch.single_sample_batches:
        return text + " (size 1!)"
    return text + (" (short)" if epoch.short_batches else "")


def _details(epoch: EpochReport) -> list[str]:
    at = f"  epoch {epoch.epoch}"
    lines = []
    if epoch.duplicates:
        named = [
            f"{d.record} x{d.occurrences}" + (f" ({d.padding} padding)" if d.padding else "") for d in epoch.duplicates
        ]
        lines.append(f"{at}: repeated: {_listed(named)}")
    if epoch.dropped_by_tail:
        lines.append(f"{at}: cut by the tail policy (rank level): {_listed(epoch.dropped_by_tail)}")
    if epoch.dropped_by_batch:
        named = [f"rank {o.rank}: {o.record}" + (" (padding)" if o.is_padding else "") for o in epoch.dropped_by_batch]
        lines.append(f"{at}: cut by drop_last (batch level): {_listed(named)}")
    if epoch.carried_in:
        lines.append(f"{at}: carried in from the previous pass: {_listed(epoch.carried_in)}")
    if epoch.carried_over:
        lines.append(f"{at}: rolled over into the next epoch: {_listed(epoch.carried_over)}")
    return [""] + lines if lines else []


def _mates(report: AuditReport) -> list[str]:
    mates = report.batch_mates
    if mates is None:
        return ["  batch mates: not measured (no records)"]
    scope = "all records" if mates.exact else f"a uniform sample of {mates.records_measured} records"
    most = report.settings.size - 1
    lowest = ", ".join(f"{record} ({count})" for record, count in mates.lowest[:5])
    return [
        f"  batch mates (distinct records that shared a batch with a record, at most {most}; {scope}):",
        (
            f"    min {mates.minimum}, mean {mates.mean:.1f}, max {mates.maximum}; "
            f"{mates.reaching_all} of {mates.records_measured} met all {most}; least mixed: {lowest}"
        ),
    ]


def _composition(report: AuditReport) -> list[str]:
    """Per epoch: how far the batches stray from the target shares, and the epoch's chi-square test."""
    if not report.composition:
        return []
    first = report.composition[0]
    target = ", ".join(f"{c}: {share:.3f}" for c, share in zip(first.classes[:_LISTED], first.target))
    more = f" ... and {len(first.classes) - _LISTED} more" if len(first.classes) > _LISTED else ""
    lines = ["", f"Batch composition ({len(first.classes)} classes; target share {target}{more}):"]
    first_steps = f"first {first.first_steps} batches"
    header = ("epoch", "steps", "worst batch", "at step", first_steps, "chi2", "dof", "p-value")
    rows = [header] + [
        (
            str(c.epoch),
            str(c.steps),
            f"{c.max_step_deviation:.3f}",
            str(c.worst_step),
            f"{c.first_steps_deviation:.3f}",
            f"{c.chi_square:.4g}",
            str(c.degrees_of_freedom),
            f"{c.p_value:.3g}",
        )
        for c in report.composition
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.append(
        "  (worst batch: largest |class share - target| in one step's batch over all ranks; first batches: the same "
        "for those batches pooled; chi2: the epoch's class counts against the target)"
    )
    return lines


def _listed(items: Iterable[object]) -> str:
    items = list(items)
    text = ", ".join(map(str, items[:_LISTED]))
    return text + (f" ... and {len(items) - _LISTED} more" if len(items) > _LISTED else "")
