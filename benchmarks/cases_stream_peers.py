"""``ShardedStream`` against litdata, mosaicml-streaming (py1e) and HF ``datasets`` (buffer shuffle),
in one run on the same records (64 shards sorted by class, window / block / buffer of 8 shards'
records for every system): resume cost and records repeated or lost after a stop and resume
mid-epoch (same and other worker count), shuffle quality, throughput at 0 and 4 workers.

Ours runs in this venv; the peers in ``.bench-venv`` (litdata and mosaicml-streaming would replace
this project's torch): ``benchmarks/stream_peers.py`` is run there once per system and task.

    python -m benchmarks.cases_stream_peers --records 100000
    python -m benchmarks.cases_stream_peers --records 1000000 --resume-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH_PYTHON = ROOT / ".bench-venv" / "bin" / "python"
SYSTEMS = ("ours", "litdata", "mosaic", "hf")
BATCH, CLASSES, SHARDS = 256, 10, 64


def task(system: str, root: Path, records: int, name: str) -> dict[str, Any]:
    python = sys.executable if system == "ours" else str(BENCH_PYTHON)
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")} if system == "ours" else {
        key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # fmt: skip
    done = subprocess.run([python, str(ROOT / "benchmarks" / "stream_peers.py"), system, str(root), str(records), name],
                          check=False, capture_output=True, text=True, env=environment, timeout=3000)  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def quality(order: list[int], records: int) -> dict[str, float]:
    """P(two batch-mates share a class) (ideal 1/CLASSES) and the class TV of the first 10 batches."""
    labels = np.asarray(order) * CLASSES // records
    batches = [labels[i : i + BATCH] for i in range(0, len(labels) - BATCH + 1, BATCH)]
    same = np.mean([(np.bincount(b, minlength=CLASSES) * (np.bincount(b, minlength=CLASSES) - 1)).sum()
                    / (len(b) * (len(b) - 1)) for b in batches])  # fmt: skip
    first = np.bincount(labels[: 10 * BATCH], minlength=CLASSES) / (10 * BATCH)
    shards = np.asarray(order) * SHARDS // records  # the input's shards, in id order
    return {"same_class_mates": float(same), "first_tv": float(0.5 * np.abs(first - 1 / CLASSES).sum()),
            "mosaic_entropy": _entropy(np.asarray(order)) + _entropy(shards)}  # fmt: skip


def _entropy(ordering: np.ndarray) -> float:
    """Mosaic's shuffle-quality metric (streaming's simulation/core/shuffle_quality.py): the entropy,
    in bits, of the gaps between consecutive ids; summed over records and shards. Higher is better."""
    gaps = np.bincount(np.abs(np.diff(ordering)))
    probabilities = gaps[gaps > 0] / (len(ordering) - 1)
    return float(-(probabilities * np.log2(probabilities)).sum())


def run(records: int, systems: tuple[str, ...], resume_only: bool = False) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        task("ours", root, records, "write")  # the parquet shards, which HF reads too
        for system in systems:
            print(f"  {system} ...", file=sys.stderr, flush=True)
            result: dict[str, Any] = {}
            if system in ("litdata", "mosaic"):
                result.update(task(system, root, records, "write"))
            epoch = {} if resume_only else task(system, root, records, "epoch")
            order = epoch.pop("order", None)
            result.update(epoch)
            if order is not None:
                result.update(quality(order, records))
                result["epoch_records"] = len(order)
            result.update({f"stop_{k}": v for k, v in task(system, root, records, "stop").items()})
            for workers in (0,) if resume_only else (0, 2):
                result.update(
                    {f"resume{workers}_{k}": v for k, v in task(system, root, records, f"resume-{workers}").items()}
                )
            results[system] = result
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cases_stream_peers", description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--resume-only", action="store_true", help="only stop and resume at 0 workers (for 10^6+)")
    args = parser.parse_args(argv)
    for system, result in run(args.records, tuple(args.systems), args.resume_only).items():
        print(system, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def figure(full: bool, run_case: Any, figures: Any) -> None:
    """``python -m benchmarks --only stream-peers`` (the peers need ``.bench-venv``; 2*10^4 records, or
    10^6 resume-only with --full). The published table is ``python -m benchmarks.cases_stream_peers``."""
    from benchmarks.figures import Row

    records = 1_000_000 if full else 20_000  # quick: about 2 minutes (HF reads about 1,300 records/s here)
    name = f"streams side by side, {records:,} class-sorted records"
    for system, result in run(records, SYSTEMS if BENCH_PYTHON.exists() else ("ours",), resume_only=full).items():
        lost = f"{result.get('resume0_lost', '?')} lost, {result.get('resume0_repeated', '?')} repeated"
        figures.rows.append(Row(name, "resume to the first batch", system, result.get("resume0_first_batch_s"), "s",
                                result.get("resume0_rss_mib"), note=lost))  # fmt: skip
        if "same_class_mates" in result:
            figures.rows.append(Row(name, "P(batch-mates share a class)", system, result["same_class_mates"], "",
                                    note=f"Mosaic entropy {result.get('mosaic_entropy', 0):.2f}"))  # fmt: skip
            figures.rows.append(Row(name, "records/s, 0 workers", system, result.get("rate_0"), "rec/s"))
