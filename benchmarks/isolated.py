"""A ``benchmarks.cases_*`` case run in a fresh interpreter (``python -m benchmarks.cases_X CASE JSON``), so
the peak RSS it reports above the post-import baseline is its own, as in ``benchmarks/child.py``."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(module: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Case ``name`` of ``module`` in a fresh interpreter; its result with its peak RSS above the baseline."""
    completed = subprocess.run(
        [sys.executable, "-m", module, name, json.dumps(params)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"case {name}({params}) failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def child(cases: dict[str, Callable[..., dict[str, Any]]], name: str, params: dict[str, Any]) -> None:
    """The fresh interpreter's side: run the case and print its result as JSON."""
    import torch  # noqa: F401 - imported before the baseline, like the library's own imports

    import stateful_sampler  # noqa: F401

    baseline = peak_mib()
    result = cases[name](**params)
    result["peak_mib_above_baseline"] = peak_mib() - baseline
    print(json.dumps(result))
