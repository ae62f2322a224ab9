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
