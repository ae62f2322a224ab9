"""Issue 19: packing and token-budget batches, side by side with the usual ways on the same log-normal lengths.

- waste: ours (``PackedRows(split_records=False)``, ``TokenBudgetBatches``) against global first-fit
  decreasing, ``DataCollatorWithFlattening``-style greedy packing (next fit in the shuffled order) and HF's
  ``LengthGroupedSampler`` (fixed batch, padded to the longest);
- cost per row / per batch of a whole epoch through our sampler against a NumPy first-fit packer;
- resume at the middle of an epoch against rebuilding the packing from the start;
- peak memory beyond the user's lengths array;
- (issue 26 item 5) an epoch's start at 10^6 / 10^7 / 10^8 records: the first row of epoch 0 and the epoch's row
  count, and the first batch after a resume at N/2, against the code before item 5 in the same run.

Each case runs in a fresh interpreter (``python -m benchmarks.cases_packing CASE JSON``), so its peak RSS is
its own (``benchmarks/isolated.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from time import perf_counter, process_time
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks import isolated

if TYPE_CHECKING:
    from benchmarks.figures import Mode

SEQ_LEN = 2048


def lognormal_lengths(size: int, dtype: Any = np.int64) -> np.ndarray:
    """Token counts of fine-tuning examples: log-normal (median e^5 = 148, mean ~245), clipped to [1, 2048]."""
    rng = np.random.default_rng(0)
    out = np.empty(size, dtype=dtype)
    for start in range(0, size, 1 << 22):  # in chunks: no float64 array of N at 10^8
        stop = min(start + (1 << 22), size)
        out[start:stop] = np.clip(rng.lognormal(5.0, 1.0, stop - start), 1, SEQ_LEN)
    return out


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> int:
    """Global FFD, the usual NumPy way: longest first, each into the first bin with room. Returns the bins."""
    rooms = np.empty(0, dtype=np.int64)
    for length in np.sort(lengths)[::-1].tolist():
        fits = np.flatnonzero(rooms >= length)
        if fits.size:
            rooms[fits[0]] -= length
        else:
            rooms = np.append(rooms, capacity - length)
    return len(rooms)


def next_fit(lengths: np.ndarray, capacity: int) -> int:
    """Greedy packing in the given order (``DataCollatorWithFlattening`` fed consecutive examples until full)."""
    bins, room = 0, 0
    for length in lengths.tolist():
        if length > room:
            bins, room = bins + 1, capacity
        room -= length
    return bins


def hf_padding_waste(lengths: np.ndarray, batch_size: int) -> float:
    """Padding share of HF's LengthGroupedSampler batches (each padded to its longest record)."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    torch.manual_seed(0)
    order = np.fromiter(LengthGroupedSampler(batch_size, lengths=lengths.tolist()), dtype=np.int64)
    return _padding_waste(lengths[order], batch_size)


def _padding_waste(ordered: np.ndarray, batch_size: int) -> float:
    steps = -(-len(ordered) // batch_size)
    grid = np.zeros(steps * batch_size, dtype=np.int64)
    grid[: len(ordered)] = ordered
    grid = grid.reshape(steps, batch_size)
    counts = (grid > 0).sum(1)
    padded = int((grid.max(1) * counts).sum())
    return 1 - int(ordered.sum()) / padded


def waste(size: int, max_tokens: int, batch_size: int) -> dict[str, Any]:
    from stateful_sampler import PackedRows, TokenBudgetBatches
    from stateful_sampler.audit import audit_packing

    lengths = lognormal_lengths(size)
    tokens = int(lengths.sum())
    ours = PackedRows(lengths, SEQ_LEN, split_records=False, seed=1).rows_in_epoch(0)
    shuffled = lengths[np.random.default_rng(1).permutation(size)]
    budget = audit_packing(TokenBudgetBatches(lengths, max_tokens, seed=1))[0]
    return {
        "rows": {"ours": tokens / (SEQ_LEN * ours), "ffd": tokens / (SEQ_LEN * first_fit_decreasing(lengths, SEQ_LEN)),
                 "greedy": tokens / (SEQ_LEN * next_fit(shuffled, SEQ_LEN))},
        "padding": {"ours": 1 - budget.tokens / budget.cost, "hf": hf_padding_waste(lengths, batch_size),
                    "random": _padding_waste(shuffled, batch_size)},
        "budget_use": budget.cost / (max_tokens * budget.rows),
    }  # fmt: skip


def cost(size: int) -> dict[str, Any]:
    """Seconds per row (per batch) of one whole epoch through our samplers, set-up included, and of the
    NumPy first-fit packer over the same windows (the usual packer, run window by window so it is comparable)."""
    from stateful_sampler import PackedRows, TokenBudgetBatches

    lengths = lognormal_lengths(size)
    result: dict[str, Any] = {}
    for name, make in (
        ("rows-whole", lambda: PackedRows(lengths, SEQ_LEN, split_records=False, seed=2)),
        ("rows-split", lambda: PackedRows(lengths, SEQ_LEN, seed=2)),
        ("batches", lambda: TokenBudgetBatches(lengths, 16384, seed=2)),
    ):
        sampler = make()
        started = perf_counter()
        count = sum(1 for _ in sampler)
        result[name] = (perf_counter() - started) / count
    started = perf_counter()
    bins = 0
    order = np.random.default_rng(2).permutation(size)
    for start in range(0, size, 4096):
        bins += first_fit_decreasing(lengths[order[start : start + 4096]], SEQ_LEN)
    result["numpy-ffd"] = (perf_counter() - started) / bins
    return result


def resume(size: int, split: bool) -> dict[str, Any]:
    """Load a state saved at the middle of epoch 0 into a fresh sampler and draw its first batch of 8 rows,
    against what a packer without the state's anchor pays: packing the epoch's windows up to its middle."""
    from stateful_sampler import PackedRows

    lengths = lognormal_lengths(size)
    make = lambda: PackedRows(lengths, SEQ_LEN, split_records=split, seed=3, batch_size=8)
    state = mid_epoch_state(make())
    middle = state["position"]
    started = perf_counter()
    resumed = make()
    constructed = perf_counter()
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    first = [next(iterator) for _ in range(8)]
    seconds = perf_counter() - constructed
    assert first[0].key.index == middle
    fresh = make().strategy.rows(0)
    started_window = perf_counter()
    fresh._built(state["packing"]["window"])  # one window alone: what "plus one window" stands for
    window = perf_counter() - started_window
    started_rebuild = perf_counter()
    fresh.anchor(middle)  # no anchor: walk the windows from the epoch's start
    rebuild = perf_counter() - started_rebuild
    return {"seconds": seconds, "construction_seconds": constructed - started, "rebuild_seconds": rebuild,
            "window_seconds": window, "rows": 2 * middle, "state_bytes": len(json.dumps(state))}  # fmt: skip


def mid_epoch_state(sampler: Any) -> dict[str, Any]:
    """The state a run on one rank saves at the middle row of epoch 0: the position, and the anchor the
    sampler's own ``state_dict`` computes for it (found here by walking the windows to it)."""
    state = sampler.state_dict()
    state["position"] = sampler.rows_in_epoch(0) // 2
    state["packing"] = sampler._anchor(state)
    return state


def memory(size: int) -> dict[str, Any]:
    """Construction, a resume at the middle of epoch 0 and 1,000 rows, at N = ``size``, lengths as int32."""
    from stateful_sampler import PackedRows

    lengths = lognormal_lengths(size, np.int32)
    user = lengths.nbytes / 2**20
    started = perf_counter()
    saving = PackedRows(lengths, SEQ_LEN, seed=4, batch_size=8)
    constructed = perf_counter()
    state = mid_epoch_state(saving)
    walked = perf_counter()
    resumed = PackedRows(lengths, SEQ_LEN, seed=4, batch_size=8)
    started_resume = perf_counter()
    resumed.load_state_dict(state)
    count = sum(1 for _, _ in zip(range(1000), resumed))
    return {"user_mib": user, "construction_seconds": constructed - started, "walk_seconds": walked - constructed,
            "resume_seconds": perf_counter() - started_resume, "rows": count}  # fmt: skip


EPOCH_START_MODES = {  # what counts an epoch's rows by packing every window: whole rows, and both token budgets
    "rows-whole": lambda lengths, **kw: _packed_rows()(lengths, SEQ_LEN, split_records=False, **kw),
    "budget-padded": lambda lengths, **kw: _token_budget()(lengths, 16384, padded=True, **kw),
    "budget-unpadded": lambda lengths, **kw: _token_budget()(lengths, 16384, padded=False, **kw),
}


def _packed_rows() -> Any:
    from stateful_sampler import PackedRows

    return PackedRows


def _token_budget() -> Any:
    from stateful_sampler import TokenBudgetBatches

    return TokenBudgetBatches


def epoch_start(size: int, mode: str, resume: bool = True) -> dict[str, Any]:
    """Seconds from building the sampler to its first row of epoch 0 (before item 5 it waited for the epoch's row
    count; now the count runs in a thread meanwhile), to the row count known (``counted_seconds``), the row count,
    and (``resume``) seconds from building a sampler to its first batch of 8 after loading a state saved at the
    middle row of epoch 0. Public API only: it runs against the code before item 5 as well."""
    lengths = lognormal_lengths(size, np.int32)
    make = lambda: EPOCH_START_MODES[mode](lengths, seed=6)
    started, cpu_started = perf_counter(), process_time()
    sampler = make()
    first = next(iter(sampler))
    seconds, cpu = perf_counter() - started, process_time() - cpu_started
    rows = sampler.rows_in_epoch(0)  # from 2^18 records on, counted in a thread while the first rows are served
    counted, cpu_counted = perf_counter() - started, process_time() - cpu_started
    result: dict[str, Any] = {"seconds": seconds, "cpu_seconds": cpu, "rows": rows}
    result.update({"counted_seconds": counted, "counted_cpu_seconds": cpu_counted})
    result["first"] = [list(piece) if isinstance(piece, tuple) else piece for piece in first]  # as JSON returns it
    if resume:
        state = mid_epoch_state(sampler)
        started = perf_counter()
        resumed = make()
        resumed.load_state_dict(state)
        iterator = iter(resumed)
        batch = [next(iterator) for _ in range(8)]
        result["resume_seconds"] = perf_counter() - started
        assert batch[0].key.index == state["position"]
    return result


def kernels(capacities: list[int], windows: int = 1024, width: int = 4096, repeat: int = 3) -> dict[str, Any]:
    """CPU seconds per window (the best of ``repeat``: other work on the cores inflates wall time) of
    ``bin_counts``' two lock-step kernels on the same log-normal windows, side by side in one run, at each
    capacity: the slots (a row of rooms up to the window's bin bound) and the room table, with the windows' bin
    bound (what ``_SLOT_LIMIT`` chooses by). The choice is private, so it is set here through
    ``order.packing._SLOT_LIMIT`` (0: the table wherever the capacity allows it; huge: the slots)."""
    from unittest import mock

    from stateful_sampler.order import packing

    lengths = lognormal_lengths(windows * width, np.int32).reshape(windows, width)
    result: dict[str, Any] = {}
    for capacity in capacities:
        seconds = {}
        for kernel, limit in (("slots", 1 << 62), ("table", 0)):
            with mock.patch.object(packing, "_SLOT_LIMIT", limit):  # private: the kernel choice (docstring)
                runs = []
                for _ in range(repeat):
                    started = process_time()
                    counts = packing.bin_counts(lengths, capacity)
                    runs.append((process_time() - started) / windows)
                seconds[kernel] = min(runs)
        bound = int(packing._bin_bounds(lengths, capacity).max())  # private: what the choice is made by
        result[str(capacity)] = {**seconds, "bound": bound, "bins": int(counts.max())}
    return result


BEFORE_ITEM_5 = "51f11899355b82ed05bc8fc12fa563115cdf31c4"  # main before issue 26 item 5 (windows packed one by one)


def run_before(name: str, base: str = BEFORE_ITEM_5, **params: Any) -> dict[str, Any]:
    """Case ``name`` against the library at commit ``base`` (before issue 26 item 5 by default), in a fresh
    interpreter that imports that copy of ``src`` first."""
    with tempfile.TemporaryDirectory() as copy:
        archive = subprocess.run(["git", "archive", base, "src"], cwd=isolated.ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", copy], input=archive.stdout, check=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([os.path.join(copy, "src"), os.environ.get("PYTHONPATH", "")]),
        }
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.cases_packing", name, json.dumps(params)],
            cwd=isolated.ROOT, capture_output=True, text=True, check=False, env=env,
        )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"case {name}({params}) at {base[:7]} failed:\n{completed.stderr[-3000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["base"] = base[:7]
    return result


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    "waste": waste, "cost": cost, "resume": resume, "memory": memory, "epoch_start": epoch_start, "kernels": kernels,
}  # fmt: skip


def run(name: str, **params: Any) -> dict[str, Any]:
    return isolated.run("benchmarks.cases_packing", name, params)


def packing(mode: Mode, run_case: Any, figures: Any) -> None:
    """The figure: waste, cost, resume and memory of issue 19 (``python -m benchmarks --only packing``)."""
    from benchmarks.figures import Check, Row

    size = mode.pick(quick=10**5, smoke=10**4)
    result = run("waste", size=size, max_tokens=16384, batch_size=16)
    label = f"N={size:.0e}"
    figure = f"packing waste, {label} log-normal lengths (median 148), rows of {SEQ_LEN}, batches of 16 / 16384 tokens"
    for system, key in (("ours: PackedRows(split_records=False)", "ours"), ("global first-fit decreasing", "ffd"),
                        ("DataCollatorWithFlattening-style greedy", "greedy")):  # fmt: skip
        figures.rows.append(Row(figure, "row fill (tokens / seq_len x rows)", system, 100 * result["rows"][key], "%"))
    for system, key in (("ours: TokenBudgetBatches(padded=True)", "ours"), ("HF LengthGroupedSampler", "hf"),
                        ("random batches", "random")):  # fmt: skip
        figures.rows.append(Row(figure, "padding share of padded tokens", system, 100 * result["padding"][key], "%"))
    gap = 100 * (result["rows"]["ffd"] - result["rows"]["ours"])
    figures.checks.append(Check("PackedRows(split_records=False) within 2 points of global FFD",
                                f"{gap:.2f} points", gap <= 2))  # fmt: skip
    costs = run("cost", size=size)
    figure = f"packing: seconds per row / batch of one epoch (set-up included), {label}"
    for name in ("rows-whole", "rows-split", "batches"):
        figures.rows.append(Row(figure, "per row", f"ours: {name}", costs[name] * 1e6, "us"))
    figures.rows.append(
        Row(figure, "per row", "NumPy first-fit decreasing, per window", costs["numpy-ffd"] * 1e6, "us")
    )
    resume_size = mode.pick(quick=10**6, full=10**7, smoke=10**4)
    for split in (False, True):
        resumed = run("resume", size=resume_size, split=split)
        name = "split" if split else "whole"
        figure = f"packing: load a state at the middle of epoch 0 + first 8 rows, N={resume_size:.0e}"
        figures.rows.append(Row(figure, name, f"ours: {name}", resumed["seconds"] * 1e3, "ms",
                                resumed["peak_mib_above_baseline"], f"{resumed['state_bytes']} B state"))  # fmt: skip
        figures.rows.append(Row(figure, name, "no anchor: pack the windows to the middle", resumed["rebuild_seconds"] * 1e3,
                                "ms"))  # fmt: skip
        budget = 0.010 + resumed["window_seconds"]
        figures.checks.append(Check(f"packing ({name}) resume at N/2 ≤ 10 ms + one window ({budget * 1e3:.1f} ms)",
                                    f"{resumed['seconds'] * 1e3:.1f} ms", resumed["seconds"] <= budget))  # fmt: skip
    if mode.full:
        measured = run("memory", size=10**8)
        extra = measured["peak_mib_above_baseline"] - measured["user_mib"]
        figures.rows.append(Row("packing memory, N=10^8", "split", "ours", extra, "MiB",
                                measured["peak_mib_above_baseline"], f"user's int32 lengths {measured['user_mib']:.0f} MiB"))  # fmt: skip
        figures.checks.append(
            Check("packing memory beyond the lengths at 10^8 ≤ 64 MB", f"{extra:.0f} MiB", extra <= 64)
        )


def epoch_starts(mode: Mode, run_case: Any, figures: Any) -> None:
    """Issue 26 item 5: an epoch's start, before and after, side by side (``python -m benchmarks --only
    packing-scale``). 10^8 runs with ``--full`` only: the code before takes minutes there."""
    from benchmarks.figures import Check, Row

    full = mode.full
    for size in mode.pick(quick=(10**6, 10**7), full=(10**6, 10**7, 10**8), smoke=(10**4,)):
        label = f"10^{len(str(size)) - 1}"
        figure = f"packing: epoch start (first row of epoch 0; then its row count), N={label} log-normal int32 lengths"
        for packing_mode in EPOCH_START_MODES:
            ours = run("epoch_start", size=size, mode=packing_mode)
            figures.rows.append(Row(figure, packing_mode, "ours: first row while the rows are counted in NumPy",
                                    ours["seconds"], "s", ours["peak_mib_above_baseline"],
                                    f"{ours['rows']} rows, counted at {ours['counted_seconds']:.3g} s (CPU "
                                    f"{ours['counted_cpu_seconds']:.3g} s)"))  # fmt: skip
            if size < 10**8 or full:
                before = run_before("epoch_start", size=size, mode=packing_mode, resume=False)
                assert before["rows"] == ours["rows"] and before["first"] == ours["first"], (packing_mode, size)
                figures.rows.append(Row(figure, packing_mode, f"before ({before['base']}): windows packed one by one",
                                        before["seconds"], "s", before["peak_mib_above_baseline"],
                                        f"{before['rows']} rows, the same, counted before the first row; the count "
                                        f"{before['counted_seconds'] / ours['counted_seconds']:.1f}× ours"))  # fmt: skip
                if size == 10**7:
                    ratio = before["seconds"] / ours["seconds"]
                    figures.checks.append(Check(f"{packing_mode}: epoch start at 10^7 ≥ 20× faster than before",
                                                f"{ratio:.1f}×", ratio >= 20))  # fmt: skip
            if size == 10**8:
                figures.checks.append(Check(f"{packing_mode}: epoch of 10^8 records starts in ≤ 15 s",
                                            f"{ours['seconds']:.1f} s", ours["seconds"] <= 15))  # fmt: skip
                figures.checks.append(Check(f"{packing_mode}: first batch after a resume at N/2 of 10^8 in ≤ 1 s",
                                            f"{ours['resume_seconds']:.2f} s", ours["resume_seconds"] <= 1))  # fmt: skip


if __name__ == "__main__":
    isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
