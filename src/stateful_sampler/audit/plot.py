"""The audit as a picture: per-record occurrences across epochs, and the batch-mate histogram.

matplotlib is an optional extra (``pip install stateful-sampler[plot]``), imported only here and
only when a picture is asked for; it draws off-screen (Agg).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stateful_sampler.audit.report import AuditReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_MAX_COLUMNS = 120  # records drawn one per column up to this; beyond, records are grouped
_PADDED = "#f28e2b"
_DROPPED = "#d62728"


def plot(report: AuditReport, path: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'stateful-sampler[plot]'") from None
    rows = 3 if report.composition else 2
    figure = plt.figure(figsize=(12, 7.5 + 3.5 * (rows - 2)), layout="constrained")
    grid = figure.add_gridspec(rows, 2, height_ratios=(1.25, 1, 1)[:rows])
    _occurrence_map(figure.add_subplot(grid[0, :]), report)
    _occurrence_histogram(figure.add_subplot(grid[1, 0]), report)
    _mates_histogram(figure.add_subplot(grid[1, 1]), report)
    if report.composition:
        _composition(figure.add_subplot(grid[2, :]), report)
    s = report.settings
    figure.suptitle(
        f"Coverage audit: N={s.size}, {s.strategy}, {s.world_size} rank(s), tail={s.tail}, batch {s.batch_size}/rank, "
        f"drop_last={s.drop_last}, seed={s.seed}{'' if s.shuffle else ', not shuffled'}",
        fontsize=13,
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _occurrence_map(axes: Axes, report: AuditReport) -> None:
    from matplotlib import colors
    from matplotlib.ticker import MaxNLocator

    counts = report.counts
    size = report.settings.size
    group = max(1, -(-size // _MAX_COLUMNS))
    # A group shows its least fed record, so a record that was not fed is never averaged away.
    occurrences = _grouped(counts.occurrences, group, np.min)
    padded = _grouped(counts.padded, group, np.any)
    dropped = _grouped(counts.dropped, group, np.any)
    top = max(2, int(occurrences.max(initial=0)))
    palette = colors.ListedColormap(["#eeeeee"] + [_blue(level / top) for level in range(1, top + 1)])
    first = report.settings.start_epoch
    image = axes.imshow(
        occurrences,
        aspect="auto",
        interpolation="nearest",
        cmap=palette,
        norm=colors.BoundaryNorm(np.arange(-0.5, top + 1), top + 1),
        extent=(-0.5, occurrences.shape[1] - 0.5, first + len(occurrences) - 0.5, first - 0.5),
    )
    colorbar = axes.figure.colorbar(image, ax=axes, pad=0.01, ticks=range(top + 1))
    colorbar.set_label("times fed" if group == 1 else "times fed (least fed record of the group)")
    epochs, columns = np.nonzero(padded)
    axes.scatter(
        columns,
        epochs + first,
        marker="o",
        s=160,
        facecolors="none",
        edgecolors=_PADDED,
        linewidths=2,
        label="padding repeat (fed or cut)",
    )
    epochs, columns = np.nonzero(dropped)
    axes.scatter(
        columns, epochs + first, marker="x", s=50, color=_DROPPED, linewidths=2, label="cut (tail or drop_last)"
    )
    unit = "record" if group == 1 else f"record group ({group} records each)"
    axes.set_xlabel(unit)
    axes.set_ylabel("epoch")
    if len(occurrences) <= 25:
        axes.set_yticks(range(first, first + len(occurrences)))
    locator = axes.xaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # the default AutoLocator is one
        locator.set_params(integer=True)
    axes.set_title("Occurrences per record and epoch (grey: not fed)")
    axes.legend(loc="upper right", bbox_to_anchor=(1.0, 1.16), ncol=2, frameon=False)


def _blue(fraction: float) -> tuple[float, float, float, float]:
    from matplotlib import colormaps

    return colormaps["Blues"](0.35 + 0.6 * fraction)


def _grouped(values: np.ndarray, group: int, reduce: Callable[..., np.ndarray]) -> np.ndarray:
    """Columns of ``group`` records reduced to one (the last group may be shorter)."""
    if group == 1:
        return values
    pad = -values.shape[1] % group
    filled = np.concatenate([values, values[:, -1:].repeat(pad, axis=1)], axis=1) if pad else values
    return reduce(filled.reshape(values.shape[0], -1, group), axis=2)


def _occurrence_histogram(axes: Axes, report: AuditReport) -> None:
    times = list(report.occurrence_histogram)
    records = list(report.occurrence_histogram.values())
    colours = [_DROPPED if count == 0 else _blue(0.6) for count in times]
    bars = axes.bar([str(t) for t in times], records, color=colours)
    axes.bar_label(bars, fmt="%d")
    axes.set_xlabel(f"times fed over {report.settings.epochs} epoch(s)")
    axes.set_ylabel("records")
    axes.set_title(f"Occurrences per record (red: never fed; {len(report.never_seen)} records)")


def _mates_histogram(axes: Axes, report: AuditReport) -> None:
    mates = report.batch_mates
    most = report.settings.size - 1
    if mates is None:
        axes.text(0.5, 0.5, "batch mates not measured", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        return
    lows = [bin.low for bin in mates.histogram]
    widths = [bin.high - bin.low + 1 for bin in mates.histogram]
    axes.bar(
        lows, [bin.records for bin in mates.histogram], width=widths, align="edge", color=_blue(0.6), edgecolor="white"
    )
    axes.axvline(mates.minimum, color=_DROPPED, linewidth=1.5)
    axes.annotate(
        f"min {mates.minimum}",
        (mates.minimum, 0.9),
        xycoords=("data", "axes fraction"),
        color=_DROPPED,
        xytext=(-4, 0),
        textcoords="offset points",
        ha="right",
    )
    scope = "all records" if mates.exact else f"sample of {mates.records_measured} records"
    right = mates.histogram[-1].high + 1
    if most < 2 * right:  # N-1 is near enough to show how far the records are from it
        axes.axvline(most + 0.5, color="#59a14f", linestyle="--", linewidth=1.5, label=f"N-1 = {most}: met everyone")
        axes.legend(loc="best", frameon=False)
        right = most + 1
    axes.set_xlim(0, right)
    axes.set_xlabel(f"distinct records that shared a batch with the record (of N-1 = {most} possible)")
    axes.set_ylabel("records")
    axes.set_title(f"Batch-mate diversity ({scope}; mean {mates.mean:.1f})")


_CLASSES_DRAWN = 9  # classes drawn one by one (the largest targets); the rest are drawn as one band


def _composition(axes: Axes, report: AuditReport) -> None:
    """Each global step's batch as stacked class shares, epoch after epoch; dashed: the target's."""
    first = report.composition[0]
    target = np.array(first.target)
    drawn = np.sort(np.argsort(-target, kind="stable")[:_CLASSES_DRAWN])
    rest = np.setdiff1d(np.arange(len(target)), drawn)
    steps = np.concatenate(report.counts.composition).astype(np.float64)
    shares = steps / np.maximum(steps.sum(axis=1, keepdims=True), 1)
    shares = np.concatenate([shares, shares[-1:]])  # step="post" draws step j over [j, j+1)
    layers = [shares[:, c] for c in drawn] + ([shares[:, rest].sum(axis=1)] if rest.size else [])
    names = [f"class {first.classes[c]}" for c in drawn] + ([f"{rest.size} other classes"] if rest.size else [])
    x = np.arange(len(shares))
    axes.stackplot(x, layers, labels=names, step="post", alpha=0.85)
    levels = np.cumsum(target[drawn])
    for level in levels[levels < 1 - 1e-9]:  # the boundaries between the target's layers
        axes.axhline(level, color="black", linestyle="--", linewidth=0.8)
    boundary = 0
    for epoch in report.composition[:-1]:
        boundary += epoch.steps
        axes.axvline(boundary, color="#555555", linewidth=1.2)
    axes.set_xlim(0, max(len(shares) - 1, 1))
    axes.set_ylim(0, 1)
    axes.set_xlabel("global step (batch j of every rank), epoch after epoch")
    axes.set_ylabel("share of the batch")
    worst = max(report.composition, key=lambda epoch: epoch.max_step_deviation)
    axes.set_title(
        f"Batch composition (dashed: target shares; largest deviation {worst.max_step_deviation:.3f} "
        f"in epoch {worst.epoch}, step {worst.worst_step})"
    )
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
