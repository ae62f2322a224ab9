"""The figures of issue 5: which cases each runs in a mode, the rows it reports and its targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from benchmarks.workloads import OURS, PLAIN_LOADER, STATEFUL_LOADER
from stateful_sampler.order.permutation import MAX_SIZE

RunCase = Callable[[str, dict[str, Any]], dict[str, Any]]
T = TypeVar("T")
MODES = ("smoke", "quick", "full")


@dataclass(frozen=True)
class Mode:
    """How large a run's figures are: ``quick`` (``make bench``), ``full`` (adds the largest sizes), or
    ``smoke``: every figure's code at a tiny size, so that CI proves each one still runs to its table
    (its numbers mean nothing, and its targets are not judged).

    Example:
        >>> Mode("smoke").pick(quick=10**7, smoke=10**4)
        10000
    """

    name: str

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.name!r}")

    @property
    def full(self) -> bool:
        return self.name == "full"

    @property
    def smoke(self) -> bool:
        return self.name == "smoke"

    def pick(self, *, quick: T, smoke: T, full: T | None = None) -> T:
        """This mode's value; ``full`` defaults to ``quick``'s."""
        if self.smoke:
            return smoke
        return full if self.full and full is not None else quick


TORCHDATA = "torchdata StatefulDataLoader"
SKIP_LOOP = "RandomSampler + skip loop"


@dataclass(frozen=True)
class Row:
    figure: str
    case: str
    system: str
    value: float | None  # None: not run, ``note`` says why
    unit: str
    peak_mib: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Check:
    target: str
    measured: str
    met: bool


@dataclass
class Figures:
    rows: list[Row]
    checks: list[Check]


def _label(size: int) -> str:
    exponent = len(str(size)) - 1
    return f"N=10^{exponent}" if size == 10**exponent else f"N={size}"


def resume_latency(mode: Mode, run: RunCase, figures: Figures) -> None:
    figure = "resume latency: load state at N/2 + first batch (batch 256)"
    sizes = mode.pick(quick=(10**6, 10**7, 10**8), smoke=(10**4,))
    against_torchdata = mode.pick(quick=10**7, smoke=10**4)  # the size of the ≥ 1000× target
    for size in sizes:
        for workers in (0, 2):
            case = f"{_label(size)}, {workers} workers"
            # Worker start-up jitters by tens of ms on a loaded machine: more pairs where it dominates.
            repeats = mode.pick(quick=15 if workers else 3, smoke=1)
            ours = run("resume_ours", {"size": size, "workers": workers, "repeats": repeats})
            figures.rows.append(Row(figure, case, OURS, ours["seconds"] * 1e3, "ms", ours["peak_mib_above_baseline"]))
            if workers:
                figures.rows.append(
                    Row(figure, case, "ours, fresh epoch (no resume)", ours["fresh_epoch_seconds"] * 1e3, "ms")
                )
                figures.checks.append(
                    Check(
                        f"{case}: resume no slower than a fresh epoch (median of paired ratios ≤ 1.1)",
                        f"{ours['paired_ratio']:.2f} ({ours['seconds'] * 1e3:.0f} ms vs fresh "
                        f"{ours['fresh_epoch_seconds'] * 1e3:.0f} ms, medians)",
                        ours["paired_ratio"] <= 1.1,
                    )
                )
            else:
                figures.checks.append(
                    Check(f"{case}: ≤ 10 ms", f"{ours['seconds'] * 1e3:.2f} ms", ours["seconds"] <= 0.010)
                )
            for system, function in ((TORCHDATA, "resume_torchdata"), (SKIP_LOOP, "resume_skip_loop")):
                if size > 10**7 and not mode.full:
                    figures.rows.append(Row(figure, case, system, None, "ms", note="skipped in quick mode"))
                    continue
                anchor = run(function, {"size": size, "workers": workers})
                figures.rows.append(
                    Row(figure, case, system, anchor["seconds"] * 1e3, "ms", anchor["peak_mib_above_baseline"])
                )
                if system == TORCHDATA and size == against_torchdata and workers == 0:
                    speedup = anchor["seconds"] / ours["seconds"]
                    figures.checks.append(
                        Check(f"{case}: ≥ 1000× faster than torchdata", f"{speedup:,.0f}×", speedup >= 1000)
                    )


def epoch_order(mode: Mode, run: RunCase, figures: Figures) -> None:
    memory = "peak memory iterating one epoch (above post-import baseline)"
    speed = "one epoch of order, time per index"
    for size in mode.pick(quick=(10**8,), full=(10**8, 10**9), smoke=(10**4,)):
        case = _label(size)
        ours = run("epoch_ours", {"size": size})
        figures.rows.append(Row(memory, case, f"{OURS} (StatefulSampler)", ours["peak_mib_above_baseline"], "MiB"))
        figures.checks.append(
            Check(
                f"{case}: ours ≤ 64 MiB above baseline",
                f"{ours['peak_mib_above_baseline']:.1f} MiB",
                ours["peak_mib_above_baseline"] <= 64,
            )
        )
        blocks = run("order_feistel_blocks", {"size": size})
        figures.rows.append(
            Row(
                speed,
                case,
                f"{OURS}: Feistel blocks of 2^14",
                blocks["seconds"] / size * 1e9,
                "ns/index",
                blocks["peak_mib_above_baseline"],
            )
        )
        figures.rows.append(
            Row(speed, case, f"{OURS}: iterating StatefulSampler", ours["seconds"] / size * 1e9, "ns/index")
        )
        if size > 10**8:
            note = "not run: O(N) anchor needs ≥ 8 GB (randperm) / ≥ 40 GB (DistributedSampler's list)"
            figures.rows.append(Row(memory, case, "DistributedSampler", None, "MiB", note=note))
            figures.rows.append(Row(memory, case, "torch.randperm", None, "MiB", note=note))
            continue
        limit = None if mode.full or size <= 10**6 else 10**6
        distributed = run("epoch_distributed", {"size": size, "limit": limit})
        note = "" if limit is None else "quick mode: first 10^6 indices (its whole order exists before the first)"
        figures.rows.append(
            Row(memory, case, "DistributedSampler", distributed["peak_mib_above_baseline"], "MiB", note=note)
        )
        randperm = run("order_randperm", {"size": size})
        figures.rows.append(Row(memory, case, "torch.randperm", randperm["peak_mib_above_baseline"], "MiB"))
        figures.rows.append(
            Row(
                speed,
                case,
                "torch.randperm",
                randperm["seconds"] / size * 1e9,
                "ns/index",
                randperm["peak_mib_above_baseline"],
            )
        )
        figures.checks.append(
            Check(
                f"{case}: Feistel block generation beats torch.randperm per index",
                f"{blocks['seconds'] / size * 1e9:.1f} vs {randperm['seconds'] / size * 1e9:.1f} ns/index",
                blocks["seconds"] < randperm["seconds"],
            )
        )


def sampler_throughput(mode: Mode, run: RunCase, figures: Figures) -> None:
    size = mode.pick(quick=10**7, smoke=10**4)
    result = run("throughput", {"size": size, "repeats": mode.pick(quick=3, full=5, smoke=1)})
    for key, figure in (
        ("batched_seconds", "sampler throughput: one epoch via BatchSampler(256)"),
        ("indices_seconds", "sampler throughput: one epoch of bare indices"),
    ):
        for system, seconds in result[key].items():
            figures.rows.append(Row(figure, _label(size), system, seconds, "s"))
    batched = result["batched_seconds"]
    best_anchor = min(seconds for system, seconds in batched.items() if system != OURS)
    speedup = best_anchor / batched[OURS]
    figures.checks.append(
        Check(
            f"{_label(size)}: via BatchSampler ≥ 1.5× the faster of RandomSampler and DistributedSampler",
            f"{speedup:.2f}×",
            speedup >= 1.5,
        )
    )


def loader_overhead(mode: Mode, run: RunCase, figures: Figures) -> None:
    figure = "DataLoader time per batch, trivial dataset (batch 256)"
    size = mode.pick(quick=10**6, smoke=10**4)
    for workers in (0, 2):
        case = f"{_label(size)}, {workers} workers"
        repeats = mode.pick(quick=5, full=7, smoke=1)
        result = run("loader_overhead", {"size": size, "workers": workers, "repeats": repeats})
        for system, seconds in result["seconds_per_batch"].items():
            figures.rows.append(Row(figure, case, system, seconds * 1e6, "µs/batch"))
        over_plain, over_torchdata = result["ours_over"][PLAIN_LOADER], result["ours_over"][STATEFUL_LOADER]
        figures.checks.append(
            Check(
                f"{case}: within 5% of {PLAIN_LOADER} (median of paired ratios)",
                f"{(over_plain - 1) * 100:+.1f}%",
                over_plain <= 1.05,
            )
        )
        figures.checks.append(
            Check(
                f"{case}: faster than torchdata (median of paired ratios)",
                f"{1 / over_torchdata:.2f}×",
                over_torchdata < 1,
            )
        )


def state_size(mode: Mode, run: RunCase, figures: Figures) -> None:
    figure = "state size"
    sizes = [10**6, 10**9, MAX_SIZE - 1]
    result = run("state_sizes", {"sizes": sizes})
    for size in sizes:
        label = _label(size) if size < MAX_SIZE - 1 else "N=2^62-1"
        figures.rows.append(Row(figure, "any N", f"{OURS}, JSON, {label}", result["ours_json_bytes"][str(size)], "B"))
    figures.rows.append(Row(figure, "any N", f"{TORCHDATA}, pickled", result["torchdata_pickle_bytes"], "B"))
    largest = max(result["ours_json_bytes"].values())
    figures.checks.append(Check("state ≤ 512 B as JSON at any N", f"{largest} B", largest <= 512))


def stream_shards(mode: Mode, run: RunCase, figures: Figures) -> None:
    """ShardedStream: quality against memory, IO per record, resume. Counted, not timed, so it
    runs in this process (``python -m benchmarks.cases_stream --plot FILE`` draws the plot)."""
    from benchmarks import cases_stream

    windows = mode.pick(quick=[1, 4, 16, 64, 256], full=list(cases_stream.WINDOWS), smoke=[1, 4])
    quality = cases_stream.stream_quality(windows, epochs=mode.pick(quick=2, full=4, smoke=1))
    for metric, figure in (
        ("first_tv", "stream: class TV distance of the first 10 batches, shards sorted by class (0 perfect)"),
        ("same_class_mates", "stream: P(two batch-mates share a class), ideal 0.10"),
    ):
        for row in quality["rows"]:
            case = f"k={row['window']} of 256 shards, {row['memory']} records held"
            figures.rows.append(Row(figure, case, "ours: window shuffle", row["window_shuffle"][metric], ""))
            figures.rows.append(Row(figure, case, "ours: whole shards (spread=1)", row["whole_shards"][metric], ""))
            figures.rows.append(Row(figure, case, "buffer shuffle, same memory", row["buffer_shuffle"][metric], ""))
    spread = cases_stream.DEFAULT_SPREAD
    io = cases_stream.stream_io(mode.pick(quick=[1, 2, 4, 8], smoke=[1, 2]), window=4, row_group=16, spread=spread)
    figure = f"stream: parquet IO per record delivered, 64 shards, k=4, spread={spread}, row groups of 16"
    for readers, result in io["per_readers"].items():
        case = f"{readers} reader(s) (ranks x workers)"
        figures.rows.append(Row(figure, case, "ours: rows read per record", result["rows_read_per_record"], "rows"))
        figures.rows.append(Row(figure, case, "ours: shards opened per epoch", result["shards_opened_per_epoch"], ""))
        figures.rows.append(Row(figure, case, "ours: bytes read per record", result["bytes_read_per_record"], "B"))
        opened = result["shards_opened_per_epoch"]
        target = f"stream, {case}: each reader opens each shard at most once per window of its group (spread times)"
        figures.checks.append(Check(target, f"{opened} opens", opened <= 64 * int(readers) * spread))
    records, shards = mode.pick(quick=(10**9, 10**4), smoke=(10**6, 10**2))
    resume = cases_stream.stream_resume(records, shards, 8)
    figure = "stream: resume, load_state_dict at mid-epoch + the first batch located"
    case = f"{_label(records)[2:]} records in {_label(shards)[2:]} shards, k=8"
    figures.rows.append(Row(figure, case, "ours", resume["seconds"] * 1e3, "ms"))
    figures.checks.append(
        Check("stream state ≤ 512 B as JSON", f"{resume['state_json_bytes']} B", resume["state_json_bytes"] <= 512)
    )
    seconds = resume["seconds"]
    target = f"stream resume ≤ 10 ms at {_label(shards)[2:]} shards"
    figures.checks.append(Check(target, f"{seconds * 1e3:.2f} ms", seconds <= 0.010))


def seeding_overhead(mode: Mode, run: RunCase, figures: Figures) -> None:
    """Issue 14: what per-sample seeding adds to a sample, fetched in DataLoader batches and one at a time."""
    from benchmarks import cases_seeding as seeding

    figure = "per-sample seeding: µs a sample (best round), dataset side of a DataLoader fetch (cheap sample)"
    for batch in (64, None):
        case = "batches of 64" if batch else "one dataset[key] at a time"
        result = seeding.per_sample_overhead_fresh(batch, mode.pick(quick=5, full=9, smoke=1))
        for system, micros in result["us_per_sample"].items():
            added, typical = result["us_over_keyed"].get(system), result["us_per_sample_median"][system]
            note = f"median {typical:.3g} µs" + ("" if added is None else f"; adds {added:.2f} µs to KeyedDataset")
            figures.rows.append(Row(figure, case, system, micros, "µs/sample", note=note))
        if batch:
            for system, limit in ((seeding.SEEDED, 10), (seeding.GENERATORS, 3)):
                added = result["us_over_keyed"][system]
                target = f"{case}: {system} adds ≤ {limit} µs a sample"
                figures.checks.append(Check(target, f"{added:.2f} µs", added <= limit))


def mixtures_and_lengths(mode: Mode, run: RunCase, figures: Figures) -> None:
    """Issue 11: Mixture resume and memory at 10^9 draws against Megatron's blended-index build (NumPy,
    timed on a prefix and scaled), and LengthGrouped against HF's LengthGroupedSampler algorithm."""
    from benchmarks import cases_mixture as mixture

    figure = "mixture: 100 sources, 10^9 draws; load state at the middle + first batch of 256"
    ours = mixture.run("mixture_resume", repeats=mode.pick(quick=5, smoke=1))
    note = f"construction {ours['construction_seconds'] * 1e3:.0f} ms (one period of {ours['period']} positions)"
    peak = ours["peak_mib_above_baseline"]
    figures.rows.append(Row(figure, "10^9 draws", "ours: Mixture", ours["seconds"] * 1e3, "ms", peak, note))
    resumed = f"{ours['seconds'] * 1e3:.2f} ms"
    figures.checks.append(Check("mixture resume ≤ 10 ms at 10^9", resumed, ours["seconds"] <= 0.010))
    figures.checks.append(Check("mixture memory ≤ 64 MB at 10^9", f"{peak:.1f} MiB", peak <= 64))
    size = mode.pick(quick=10**8, smoke=10**5)
    timed = mode.pick(quick=20_000, full=200_000, smoke=1_000)
    megatron = mixture.run("megatron_build", size=size, timed_steps=timed)
    draws = f"{_label(size)[2:]} draws"
    figure = f"mixture: index build before the first batch, {draws} of 100 sources"
    note = f"greedy loop timed over {megatron['timed_steps']} samples, scaled to {_label(size)[2:]}"
    figures.rows.append(Row(figure, draws, "Megatron build_blending_indices (NumPy)", megatron["seconds"], "s",
                            megatron["peak_mib_above_baseline"], note))  # fmt: skip
    figures.rows.append(Row(figure, draws, "ours: Mixture (one period table, O(draws) never)",
                            ours["construction_seconds"], "s", peak, "construction at 10^9 draws, from the row above"))  # fmt: skip
    size = mode.pick(quick=10**6, full=10**7, smoke=10**4)
    lengths = mixture.run("length_grouped", size=size, batch_size=32, megabatch=50)
    case = f"{_label(size)}, log-normal lengths, batch 32/rank, megabatch 50"
    labels = {"ours": "ours: LengthGrouped", "hf": "HF LengthGroupedSampler algorithm", "uniform": "uniform order"}
    for name, seconds in lengths["seconds_per_index"].items():
        figures.rows.append(Row("length-grouped: per-index cost of one epoch", case, labels[name], seconds * 1e9, "ns"))
    for ranks, waste in lengths["padding_waste"].items():
        for name, share in waste.items():
            figures.rows.append(Row("length-grouped: padding waste (padding / total tokens)",
                                    f"{case}, {ranks} rank(s)", labels[name], share * 100, "%"))  # fmt: skip
    ours_waste, hf_waste = lengths["padding_waste"]["4"]["ours"], lengths["padding_waste"]["4"]["hf"]
    figures.checks.append(Check("LengthGrouped padding waste within 1 point of HF's (4 ranks)",
                                f"{ours_waste:.1%} vs {hf_waste:.1%}", ours_waste <= hf_waste + 0.01))  # fmt: skip


def weighted_and_stratified(mode: Mode, run: RunCase, figures: Figures) -> None:
    """Issue 10: Weighted and Stratified per-index cost against torch's WeightedRandomSampler and plain NumPy
    per-epoch orders, resume at N/2 (construction excluded: a fresh start pays it too), and peak memory."""
    from benchmarks import cases_strata as strata

    size = mode.pick(quick=10**6, full=10**7, smoke=10**4)
    case = f"{_label(size)}, 10 classes of geometric sizes"
    cost = f"weighted/stratified: per-index cost of one epoch (pass set-up included), {case}"
    pairs = (("weighted", "torch-weighted"), ("weighted-no-replacement", "torch-weighted-no-replacement"),
             ("proportional", "numpy-proportional"), ("balanced", "numpy-balanced"))  # fmt: skip
    for strategy, system in pairs:
        ours = strata.run("ours", size=size, strategy=strategy)
        note = f"construction {ours['construction_seconds']:.2f} s; the user's arrays {ours['user_mib']:.0f} MiB"
        figures.rows.append(Row(cost, strategy, f"ours: {strategy}", ours["seconds_per_index"] * 1e9, "ns",
                                ours["peak_mib_above_baseline"], note))  # fmt: skip
        other = strata.run("anchor", size=size, system=system)
        figures.rows.append(Row(cost, strategy, system, other["seconds_per_index"] * 1e9, "ns",
                                other["peak_mib_above_baseline"]))  # fmt: skip
        resumed = strata.run("resume", size=size, strategy=strategy)
        note = "one pass set-up (sort of N keys)" if strategy == "weighted-no-replacement" else ""
        figures.rows.append(Row(f"weighted/stratified: load state at N/2 + first batch of 256, {case}", strategy,
                                f"ours: {strategy}", resumed["seconds"] * 1e3, "ms", resumed["peak_mib_above_baseline"],
                                note))  # fmt: skip
        if strategy != "weighted-no-replacement":
            figures.checks.append(Check(f"{strategy} resume at N/2 ≤ 10 ms ({_label(size)})",
                                        f"{resumed['seconds'] * 1e3:.2f} ms", resumed["seconds"] <= 0.010))  # fmt: skip


def groups_and_bands(mode: Mode, run: RunCase, figures: Figures) -> None:
    """Issue 10: Grouped and Curriculum per-index cost against plain NumPy per-epoch orders (a group permutation
    plus concat, a per-band permutation plus concat), resume at N/2, and peak memory against the user's array."""
    from benchmarks import cases_sequences as sequences

    size = mode.pick(quick=10**7, smoke=10**4)
    case = f"{_label(size)}, sequences of 1..199 records (mean 100) / 5 bands"
    cost = f"grouped/curriculum: per-index cost of one epoch (pass set-up included), {case}"
    pairs = (("grouped", "numpy-grouped"), ("grouped-shuffle-within", None), ("curriculum", "numpy-curriculum"))
    for strategy, system in pairs:
        ours = sequences.run("ours", size=size, strategy=strategy)
        note = f"construction {ours['construction_seconds']:.2f} s; the user's array {ours['user_mib']:.0f} MiB"
        figures.rows.append(Row(cost, strategy, f"ours: {strategy}", ours["seconds_per_index"] * 1e9, "ns",
                                ours["peak_mib_above_baseline"], note))  # fmt: skip
        if system is not None:
            other = sequences.run("anchor", size=size, system=system)
            figures.rows.append(Row(cost, strategy, system, other["seconds_per_index"] * 1e9, "ns",
                                    other["peak_mib_above_baseline"]))  # fmt: skip
        resumed = sequences.run("resume", size=size, strategy=strategy)
        figures.rows.append(
            Row(
                f"grouped/curriculum: load state at N/2 + first batch of 256, {case}",
                strategy,
                f"ours: {strategy}",
                resumed["seconds"] * 1e3,
                "ms",
                resumed["peak_mib_above_baseline"],
            )
        )
        figures.checks.append(Check(f"{strategy} resume at N/2 ≤ 10 ms ({_label(size)})",
                                    f"{resumed['seconds'] * 1e3:.2f} ms", resumed["seconds"] <= 0.010))  # fmt: skip
        if strategy == "grouped":
            extra = ours["peak_mib_above_baseline"] - ours["user_mib"]
            figures.checks.append(Check(f"grouped memory beyond the user's array is O(G) ({ours['groups']} groups)",
                                        f"{extra:.0f} MiB", extra <= 0.25 * ours["user_mib"]))  # fmt: skip


def framework_resume(mode: Mode, run: RunCase, figures: Figures) -> None:
    """Issue 12: the HF Trainer resumed at a late step of a large epoch, with its own skip and with ResumableTrainer."""
    from benchmarks import cases_frameworks as frameworks

    size, step = mode.pick(quick=(10**6, 30_000), full=(10**7, 300_000), smoke=(10**4, 100))
    result = frameworks.hf_resume(size, step)
    figure = "HF Trainer resume: s from train() to the first step after the checkpoint (tiny GPT-2, batch 32)"
    case = f"{_label(size)}, step {step} of {result['batches_per_epoch']}"
    for system, seconds in result["seconds"].items():
        figures.rows.append(Row(figure, case, system, seconds, "s"))
    ours, fresh, stock = (result["seconds"][name] for name in (frameworks.OURS, frameworks.FRESH, frameworks.STOCK))
    figures.checks.append(Check(f"{case}: ResumableTrainer resumes within 0.5 s of a fresh start",
                                f"{ours - fresh:+.2f} s", ours - fresh <= 0.5))  # fmt: skip
    figures.checks.append(Check(f"{case}: faster than the Trainer's skip", f"{stock / ours:.1f}x", ours < stock))


Figure = Callable[[Mode, RunCase, Figures], None]
FIGURES: dict[str, Figure] = {
    "resume": resume_latency,
    "memory": epoch_order,
    "throughput": sampler_throughput,
    "loader": loader_overhead,
    "state": state_size,
    "stream": stream_shards,
    "seeding": seeding_overhead,
    "mixture": mixtures_and_lengths,
    "strata": weighted_and_stratified,
    "sequences": groups_and_bands,
    "frameworks": framework_resume,
}
