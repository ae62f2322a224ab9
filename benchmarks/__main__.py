"""``python -m benchmarks [--quick | --full] [--json FILE] [--only FIGURE ...]``: run the figures
side by side and print one markdown table per figure plus the targets, met or missed."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.cases_packing import packing
from benchmarks.cases_stream_peers import figure as stream_peers
from benchmarks.cases_stream_remote import figure as stream_remote
from benchmarks.figures import FIGURES, Figures

# issues 18 and 19's figures, each kept in its own module
FIGURES = {**FIGURES, "packing": packing, "stream-remote": stream_remote, "stream-peers": stream_peers}

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


def markdown(figures: Figures) -> str:
    """A table per figure; the ratio is anchor ÷ ours (the case's first "ours" row), so > 1 means
    ours is smaller or faster by that factor."""
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
            reference = next(r for r in rows if r.case == row.case and r.system.startswith("ours"))
            ratio = (
                ""
                if row.system.startswith("ours") or row.value is None or not reference.value
                else f"{row.value / reference.value:,.1f}×"
            )
            value = "—" if row.value is None else f"{_number(row.value)} {row.unit}"
            lines.append(f"| {row.case} | {row.system} | {value} | {_number(row.peak_mib)} | {ratio} | {row.note} |")
    lines += ["", "### targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [
        f"| {check.target} | {check.measured} | {'met' if check.met else '**MISSED**'} |" for check in figures.checks
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: under 3 minutes on 2 cores")
    mode.add_argument("--full", action="store_true", help="adds the 10^8 resume anchors and N=10^9")
    parser.add_argument("--json", type=Path, help="also write the rows, targets and machine here")
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="run only these figures")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    figures = Figures(rows=[], checks=[])
    for name in args.only or FIGURES:
        print(f"{name}:", file=sys.stderr, flush=True)
        FIGURES[name](args.full, run_case, figures)
    elapsed = time.perf_counter() - started

    info = machine()
    mode_name = "full" if args.full else "quick"
    print(f"## stateful-sampler benchmarks ({mode_name} mode, {elapsed:.0f} s)\n")
    print(", ".join(f"{key} {value}" for key, value in info.items()))
    print(markdown(figures))
    if args.json:
        report = {
            "mode": mode_name,
            "seconds": elapsed,
            "machine": info,
            "rows": [asdict(row) for row in figures.rows],
            "checks": [asdict(check) for check in figures.checks],
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
