"""``python -m benchmarks [--quick | --full | --smoke] [--json FILE] [--only FIGURE ...]``: run the
figures side by side and print each figure's markdown tables and targets, met or missed, as soon as
it is measured, then every target together.

A figure that fails is reported (its traceback on stderr, the rows it measured before the failure
kept) and the run goes on to the next; the exit code is 1 when any figure failed. ``--smoke`` runs
every figure at a tiny size: CI's check that the documented command still runs to its tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import isolated
from benchmarks.cases import CASES
from benchmarks.cases_certificate import figure as certificate
from benchmarks.cases_compose import figure as compose
from benchmarks.cases_packing import epoch_starts, packing
from benchmarks.cases_stream_peers import figure as stream_peers
from benchmarks.cases_stream_remote import figure as stream_remote
from benchmarks.figures import FIGURES, Check, Figures, Mode, RunCase

# issues 18, 19, 26 and 28's figures, each kept in its own module
FIGURES = {
    **FIGURES,
    "packing": packing,
    "packing-scale": epoch_starts,
    "stream-remote": stream_remote,
    "stream-peers": stream_peers,
    "certificate": certificate,
    "compose": compose,
}

ROOT = Path(__file__).resolve().parent.parent


def run_case(function: str, params: dict[str, Any]) -> dict[str, Any]:
    """One case in a fresh interpreter, so its peak RSS is its own."""
    started = time.perf_counter()
    print(f"  {function}({params}) ...", end="", file=sys.stderr, flush=True)
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.child", function, json.dumps(params)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        print(" failed", file=sys.stderr, flush=True)
        raise RuntimeError(f"case {function}({params}) failed:\n{completed.stderr[-3000:]}")
    print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    import torchdata

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "torchdata": torchdata.__version__,
        "platform": platform.platform(),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 0.01 else f"{value:.2g}"


def markdown(figures: Figures, *, judged: bool = True) -> str:
    """A table per figure, then its targets; the ratio is anchor ÷ ours (the case's first "ours" row),
    so > 1 means ours is smaller or faster by that factor. ``judged=False`` (a smoke run, whose tiny
    sizes say nothing of a target) shows the targets' values without a verdict."""
    return "\n".join([*_tables(figures), *_targets(figures.checks, judged)])


def _tables(figures: Figures) -> list[str]:
    lines: list[str] = []
    for figure in dict.fromkeys(row.figure for row in figures.rows):
        rows = [row for row in figures.rows if row.figure == figure]
        lines += [
            "",
            f"### {figure}",
            "",
            "| case | system | value | peak MiB | anchor ÷ ours | note |",
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            reference = next((r for r in rows if r.case == row.case and r.system.startswith("ours")), None)
            ratio = (
                ""
                if row.system.startswith("ours") or row.value is None or reference is None or not reference.value
                else f"{row.value / reference.value:,.1f}×"
            )
            value = "—" if row.value is None else f"{_number(row.value)} {row.unit}"
            lines.append(f"| {row.case} | {row.system} | {value} | {_number(row.peak_mib)} | {ratio} | {row.note} |")
    return lines


def _targets(checks: list[Check], judged: bool, title: str = "targets") -> list[str]:
    if not checks:
        return []
    verdicts = [("met" if check.met else "**MISSED**") if judged else "not judged (smoke)" for check in checks]
    lines = ["", f"### {title}", "", "| target | measured | met |", "|---|---|---|"]
    return lines + [f"| {check.target} | {check.measured} | {verdict} |" for check, verdict in zip(checks, verdicts)]


def run_case_here(function: str, params: dict[str, Any]) -> dict[str, Any]:
    """One case in this process: the smoke pass, whose numbers are not judged, starts no interpreter per case."""
    print(f"  {function}({params})", file=sys.stderr, flush=True)
    return isolated.measured(CASES[function], params)


def run_figures(names: list[str], mode: Mode) -> tuple[Figures, dict[str, str]]:
    """Each figure in turn, its tables printed on stdout as soon as it is measured; the rows and targets
    of all, and the figures that failed with their errors. A failure is printed with what the figure
    measured before it, and the next figure runs: one broken case never loses the rest of the run."""
    with isolated.in_this_process() if mode.smoke else nullcontext():
        return _run_figures(names, mode, run_case_here if mode.smoke else run_case)


def _run_figures(names: list[str], mode: Mode, run: RunCase) -> tuple[Figures, dict[str, str]]:
    figures = Figures(rows=[], checks=[])
    failed: dict[str, str] = {}
    for name in names:
        print(f"{name}:", file=sys.stderr, flush=True)
        measured = Figures(rows=[], checks=[])
        started = time.perf_counter()
        try:
            FIGURES[name](mode, run, measured)
        except Exception as error:  # noqa: BLE001  # reported, and the run goes on to the next figure
            traceback.print_exc(file=sys.stderr)
            failed[name] = f"{type(error).__name__}: {error}".splitlines()[0]
        seconds = time.perf_counter() - started
        print(f"\n## {name} ({seconds:.1f} s)", flush=True)
        print(markdown(measured, judged=not mode.smoke), flush=True)
        if name in failed:
            kept = f"the {len(measured.rows)} row(s) above were measured before it" if measured.rows else "no row"
            print(f"\n**FAILED**: {failed[name]} ({kept}; the traceback is on stderr)", flush=True)
        figures.rows += measured.rows
        figures.checks += measured.checks
    return figures, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="the default: about 4 minutes on 2 shared cores")
    modes.add_argument("--full", action="store_true", help="adds the 10^8 resume anchors and N=10^9")
    modes.add_argument(
        "--smoke",
        action="store_true",
        help="every figure at a tiny size: checks that each runs (its numbers mean nothing)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows, targets and machine here")
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="run only these figures")
    args = parser.parse_args(argv)

    mode = Mode("full" if args.full else "smoke" if args.smoke else "quick")
    info = machine()
    print(f"# stateful-sampler benchmarks ({mode.name} mode)\n")
    print(", ".join(f"{key} {value}" for key, value in info.items()), flush=True)
    started = time.perf_counter()
    figures, failed = run_figures(list(args.only or FIGURES), mode)
    elapsed = time.perf_counter() - started
    print(f"\n## all figures ({mode.name} mode, {elapsed:.0f} s)")
    print("\n".join(_targets(figures.checks, judged=not mode.smoke, title="every target")))
    if failed:
        print("\n### failed figures\n")
        print("\n".join(f"- {name}: {error}" for name, error in failed.items()))
    if args.json:
        report = {
            "mode": mode.name,
            "seconds": elapsed,
            "machine": info,
            "rows": [asdict(row) for row in figures.rows],
            "checks": [asdict(check) for check in figures.checks],
            "failed": failed,
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
