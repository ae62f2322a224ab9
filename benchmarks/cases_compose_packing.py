"""Issue 26 item 5, part of the figure ``compose`` (``python -m benchmarks --only compose``): whole-record
packing's epoch start at 10^6 / 10^7 (and 10^8 with ``--full``), three implementations side by side in one run:

- ours (this tree): ``bin_counts``' lock-step (a row of slots a window where it opens few bins, else the room table);
- the first vectorised count (``FIRST_LOCK_STEP``, main before this change);
- the walk before item 5 (``cases_packing.BEFORE_ITEM_5``): every window packed one by one in Python.

Each runs ``cases_packing.epoch_start`` in a fresh interpreter (the older two from a ``git archive`` of their
``src``), and the rows and first row of every run must agree: the same rows, only cheaper to count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.cases_packing import BEFORE_ITEM_5, EPOCH_START_MODES, run, run_before

if TYPE_CHECKING:
    from benchmarks.figures import Mode

FIRST_LOCK_STEP = "3ab5bfaaf16cf56b23fa02533e097126b40462c7"  # main with the first vectorised count (50cc609)
START_TARGET_SECONDS = 15.0  # an epoch of 10^8 records starts in at most this
RESUME_TARGET_SECONDS = 1.0  # and the first batch after a resume at N/2 comes in at most this


def figure(mode: Mode, run_case: Any, figures: Any) -> None:
    """Epoch start (seconds to the first row of epoch 0, which waits for the epoch's row count) and, at 10^8,
    the first batch after a resume at N/2; CPU seconds beside each, the machine being shared."""
    from benchmarks.figures import Check, Row

    for size in mode.pick(quick=(10**6, 10**7), full=(10**6, 10**7, 10**8), smoke=(10**4,)):
        label = f"10^{len(str(size)) - 1}"
        figure_name = f"whole-record packing: epoch start, N={label} log-normal int32 lengths (median 148)"
        for packing_mode in ("rows-whole",) if mode.smoke else EPOCH_START_MODES:  # smoke: that the figure runs
            ours = run("epoch_start", size=size, mode=packing_mode, resume=size == 10**8)
            figures.rows.append(Row(figure_name, packing_mode, "ours: lock-step, slots or room table", ours["seconds"], "s",
                                    ours["peak_mib_above_baseline"],
                                    f"{ours['rows']} rows; CPU {ours['cpu_seconds']:.3g} s"))  # fmt: skip
            for base, system in ((FIRST_LOCK_STEP, "first lock-step"), (BEFORE_ITEM_5, "windows packed one by one")):
                if base == BEFORE_ITEM_5 and size == 10**8 and not mode.full:
                    continue
                before = run_before("epoch_start", base=base, size=size, mode=packing_mode, resume=False)
                assert before["rows"] == ours["rows"] and before["first"] == ours["first"], (base, packing_mode, size)
                figures.rows.append(Row(figure_name, packing_mode, f"{system} ({base[:7]})", before["seconds"], "s",
                                        before["peak_mib_above_baseline"],
                                        f"the same rows; CPU {before['cpu_seconds']:.3g} s, "
                                        f"{before['cpu_seconds'] / ours['cpu_seconds']:.1f}x ours"))  # fmt: skip
            if size == 10**8:
                figures.checks.append(Check(f"{packing_mode}: an epoch of 10^8 records starts in ≤ 15 s",
                                            f"{ours['seconds']:.1f} s (CPU {ours['cpu_seconds']:.1f} s)",
                                            ours["seconds"] <= START_TARGET_SECONDS))  # fmt: skip
                figures.checks.append(Check(f"{packing_mode}: first batch after a resume at N/2 of 10^8 in ≤ 1 s",
                                            f"{ours['resume_seconds']:.2f} s",
                                            ours["resume_seconds"] <= RESUME_TARGET_SECONDS))  # fmt: skip
