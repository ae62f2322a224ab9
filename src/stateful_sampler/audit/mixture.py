"""The mixture audit: how the draws of a ``Mixture`` split over its sources, against the target weights.

Which source each stream position takes does not depend on the seed (the seed only picks the records
inside each source), so this is computed from the strategy itself, from the stream's start: per-epoch
and cumulative shares, the largest deviation of any source's count from its target over every prefix,
and how many passes over its records each source has completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stateful_sampler.order.mixture import Mixture

_BLOCK = 1 << 15


@dataclass(frozen=True)
class MixtureAudit:
    epochs: range
    targets: np.ndarray  # (epochs, sources): the normalised weights each epoch draws at
    epoch_shares: np.ndarray  # (epochs, sources): each source's share of that epoch's draws
    cumulative_shares: np.ndarray  # (epochs, sources): shares of all draws from epoch 0 to the end of that epoch
    largest_prefix_deviation: float  # max over prefixes and sources of |count - target count|
    source_epochs_completed: np.ndarray  # (sources,): whole passes over each source's records by the end
    curve_positions: np.ndarray  # stream positions where ``curve_shares`` is sampled (for the plot)
    curve_shares: np.ndarray  # (points, sources): cumulative shares at those positions

    def table(self) -> str:
        """Per source: its target, its share of the last epoch and of every draw, and its passes."""
        last = len(self.epochs) - 1
        lines = [f"{'source':>6} {'target':>8} {'epoch ' + str(self.epochs[last]):>9} {'cumul.':>8} {'passes':>7}"]
        for d in range(self.targets.shape[1]):
            lines.append(
                f"{d:>6} {self.targets[last, d]:>8.4f} {self.epoch_shares[last, d]:>9.4f} "
                f"{self.cumulative_shares[last, d]:>8.4f} {int(self.source_epochs_completed[d]):>7}"
            )
        lines.append(f"largest prefix deviation: {self.largest_prefix_deviation:.3f} draws (bound: < 1)")
        return "\n".join(lines)


def audit_mixture(mixture: Mixture, epochs: int, points: int = 400) -> MixtureAudit:
    """Audit the first ``epochs`` epochs of ``mixture``'s stream, block by block (O(block x sources) memory).

    The target count of a prefix is the draws before its constant-weight segment plus the segment's
    share of the positions since the segment started; the bound holds within each segment."""
    if mixture.change is not None:
        raise ValueError(
            f"{mixture!r} continues a saved run from its change on: audit it with the run's earlier mixtures, "
            f"audit_segments(first, ..., mixture, until=(epoch, position))"
        )
    sources = len(mixture.sizes)
    length = mixture.num_samples
    counts = np.zeros(sources, dtype=np.int64)
    targets = np.array([mixture.weights_at(epoch) for epoch in range(epochs)])
    epoch_counts = np.zeros((epochs, sources), dtype=np.int64)
    cumulative = np.zeros((epochs, sources), dtype=np.int64)
    sample_at = np.unique(np.geomspace(1, epochs * length, points).astype(np.int64))  # prefixes, log-spaced
    curve_positions: list[int] = []
    curve_counts: list[np.ndarray] = []  # one row of per-source counts per sampled prefix
    worst = 0.0
    for epoch in range(epochs):
        segment_start = mixture.segment_start(epoch)
        base = mixture.draws_before(segment_start).astype(np.float64)
        done = (epoch - segment_start) * length
        for start in range(0, length, _BLOCK):
            positions = np.arange(start, min(start + _BLOCK, length), dtype=np.int64)
            drawn, _ = mixture.locate(epoch, positions)
            onehot = np.zeros((len(positions), sources), dtype=np.int64)
            onehot[np.arange(len(positions)), drawn] = 1
            prefix = counts + np.cumsum(onehot, axis=0)
            target = base + np.outer(done + positions + 1, targets[epoch])
            worst = max(worst, float(np.abs(prefix - target).max()))
            sampled = np.flatnonzero(np.isin(epoch * length + positions + 1, sample_at))
            curve_positions.extend((epoch * length + positions[sampled] + 1).tolist())
            curve_counts.extend(prefix[sampled])
            counts = prefix[-1].copy()
            epoch_counts[epoch] += onehot.sum(axis=0)
        cumulative[epoch] = counts
    drawn_total = (np.arange(1, epochs + 1) * length)[:, None]
    positions_array = np.array(curve_positions, dtype=np.int64)
    return MixtureAudit(
        epochs=range(epochs),
        targets=targets,
        epoch_shares=epoch_counts / length,
        cumulative_shares=cumulative / drawn_total,
        largest_prefix_deviation=worst,
        source_epochs_completed=mixture.draws_before(epochs) // mixture.sizes,
        curve_positions=positions_array,
        curve_shares=np.array(curve_counts, dtype=np.float64).reshape(-1, sources) / positions_array[:, None],
    )


@dataclass(frozen=True)
class SegmentShares:
    """One constant-weight segment of a run: where it lies, the weights in force and what was drawn."""

    start: tuple[int, int]  # (epoch, position) of its first draw
    stop: tuple[int, int]  # (epoch, position) after its last
    weights: np.ndarray  # (sources,): the normalised weights in force
    shares: np.ndarray  # (sources,): each source's realised share of the segment's draws
    draws: int  # the segment's draws (stream positions)
    largest_prefix_deviation: float  # max over the segment's prefixes and sources of |count - target count|


@dataclass(frozen=True)
class ChangeAudit:
    """A run's segments across its changes (a schedule's entries and changes at a resume)."""

    num_samples: int
    segments: list[SegmentShares]

    def table(self) -> str:
        """One line per segment: where it starts, its draws, and each source's realised share against its weight."""
        lines = [f"{'segment':>16} {'draws':>10} {'deviation':>9}  share/weight per source"]
        for segment in self.segments:
            pairs = " ".join(f"{s:.3f}/{w:.3f}" for s, w in zip(segment.shares, segment.weights))
            lines.append(f"{segment.start!s:>16} {segment.draws:>10} {segment.largest_prefix_deviation:>9.3f}  {pairs}")
        return "\n".join(lines)


def audit_segments(*mixtures: Mixture, until: tuple[int, int]) -> ChangeAudit:
    """The realised share of each source in every constant-weight segment of a run, against its weights, up to
    ``until`` (epoch, position). ``mixtures`` are the run's mixtures in order: the first run's, then each one a
    resume continued with (``sampler.strategy`` after ``load_state_dict``), each from its change on; a mixture
    that does not continue the draws of the one before it is refused. The state keeps no weights of earlier
    segments (it stays O(sources)), so the mixtures of the earlier runs are what the audit reads them from.

    Example:
        >>> first = Mixture([4, 6], [1, 1], num_samples=10)
        >>> second = Mixture([4, 6, 5], [1, 0, 1], num_samples=10).continued_at(6, first.draws_before(0, 6).tolist() + [0])
        >>> [segment.shares.tolist() for segment in audit_segments(first, second, until=(1, 0)).segments]
        [[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]]
    """
    if not mixtures:
        raise ValueError("audit_segments needs at least one mixture")
    num_samples = mixtures[0].num_samples
    sources = max(len(m.sizes) for m in mixtures)
    end = _stream(until, num_samples)
    changes = [m.change for m in mixtures[1:] if m.change is not None]
    if (
        any(m.num_samples != num_samples for m in mixtures)
        or len(changes) < len(mixtures) - 1
        or changes != sorted(changes)
    ):
        raise ValueError(
            "audit_segments takes a run's mixtures in order, of one num_samples: the first, then each continued "
            f"at a later resume (Mixture.change set), got changes {[m.change for m in mixtures]}"
        )
    segments: list[SegmentShares] = []
    for index, mixture in enumerate(mixtures):
        stop = min(end, changes[index]) if index < len(changes) else end
        if index:
            at = divmod(changes[index - 1], num_samples)
            expected = np.zeros(len(mixture.sizes), dtype=np.int64)
            drawn = mixtures[index - 1].draws_before(*at)
            expected[: len(drawn)] = drawn
            if (mixture.draws_before(*at) != expected).any():
                raise ValueError(f"mixture {index} does not continue the draws of mixture {index - 1} at its change")
        starts = [_stream(start, num_samples) for start in mixture.segment_starts()]
        for first, last in zip(starts, [*starts[1:], stop]):
            last = min(last, stop)
            if first < last:
                segments.append(_segment_shares(mixture, first, last, sources))
    return ChangeAudit(num_samples, segments)


def _segment_shares(mixture: Mixture, first: int, last: int, sources: int) -> SegmentShares:
    """A segment's realised shares and its largest prefix deviation, block by block (O(block x sources))."""
    length = mixture.num_samples
    weights = np.zeros(sources)
    in_force = mixture.weights_at(*divmod(first, length))
    weights[: len(in_force)] = in_force
    counts = np.zeros(sources, dtype=np.int64)
    worst = 0.0
    for start in range(first, last, _BLOCK):
        stream = np.arange(start, min(start + _BLOCK, last), dtype=np.int64)
        epochs, positions = np.divmod(stream, length)
        drawn = np.concatenate([mixture.locate(int(e), positions[epochs == e])[0] for e in np.unique(epochs).tolist()])
        prefix = counts + np.cumsum(np.eye(sources, dtype=np.int64)[drawn], axis=0)
        worst = max(worst, float(np.abs(prefix - np.outer(stream - first + 1, weights)).max()))
        counts = prefix[-1].copy()
    shares = counts / (last - first)
    return SegmentShares(divmod(first, length), divmod(last, length), weights, shares, last - first, worst)


def _stream(at: tuple[int, int], num_samples: int) -> int:
    return at[0] * num_samples + at[1]


def source_of(mixture: Mixture, records: np.ndarray) -> np.ndarray:
    """The source each record (an index of the concatenated data) belongs to."""
    return np.searchsorted(mixture.offsets + mixture.sizes, records, side="right")


def plot_mixture(audit: MixtureAudit, path: str | Path, names: list[str] | None = None) -> None:
    """Cumulative shares of each source along the stream, against the target weights (dashed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the mixture plot needs matplotlib: pip install 'stateful-sampler[plot]'") from None
    figure, axes = plt.subplots(figsize=(9, 4.5), layout="constrained")
    length = len(audit.curve_positions) and int(audit.curve_positions[-1]) // len(audit.epochs)
    for d in range(audit.targets.shape[1]):
        label = names[d] if names else f"source {d}"
        (line,) = axes.plot(audit.curve_positions, audit.curve_shares[:, d], label=label)
        steps = np.repeat(audit.targets[:, d], 2)
        edges = np.repeat(np.arange(len(audit.epochs) + 1) * length, 2)[1:-1]
        axes.plot(edges, steps, linestyle="--", color=line.get_color(), linewidth=1)
    axes.set_xscale("log")
    axes.set_xlabel("draws (prefix of the stream, log scale)")
    axes.set_ylabel("cumulative share")
    axes.set_title(f"Mixture: cumulative source shares (solid) against targets (dashed); "
                   f"largest prefix deviation {audit.largest_prefix_deviation:.2f} draws")  # fmt: skip
    axes.legend(loc="best", fontsize="small")
    figure.savefig(path, dpi=110)
    plt.close(figure)
