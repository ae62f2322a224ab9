"""A ``benchmarks.cases_*`` case run in a fresh interpreter (``python -m benchmarks.cases_X CASE JSON``), so
the peak RSS it reports above the post-import baseline is its own, as in ``benchmarks/child.py``.

The smoke pass (``python -m benchmarks --smoke``) runs the cases in its own process instead
(``in_this_process``): it checks that every figure runs, and its numbers, peak RSS included, are not judged.
"""

from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_in_process = False  # in_this_process() is in force


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def in_this_process() -> Iterator[None]:
    """While in force, ``run`` calls the case in this process: no interpreter start per case."""
    global _in_process
    previous, _in_process = _in_process, True
    try:
        yield
    finally:
        _in_process = previous


def run(module: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Case ``name`` of ``module`` in a fresh interpreter; its result with its peak RSS above the baseline."""
    if _in_process:
        return measured(importlib.import_module(module).CASES[name], params)
    completed = subprocess.run(
        [sys.executable, "-m", module, name, json.dumps(params)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"case {name}({params}) failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def measured(case: Callable[..., dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """The case's result, with the peak RSS it added above the process's high-water mark before it."""
    baseline = peak_mib()
    result = case(**params)
    result["peak_mib_above_baseline"] = peak_mib() - baseline
    return result


def child(cases: dict[str, Callable[..., dict[str, Any]]], name: str, params: dict[str, Any]) -> None:
    """The fresh interpreter's side: run the case and print its result as JSON."""
    import torch  # noqa: F401 - imported before the baseline, like the library's own imports

    import stateful_sampler  # noqa: F401

    print(json.dumps(measured(cases[name], params)))
