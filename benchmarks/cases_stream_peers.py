"""``ShardedStream`` against litdata, mosaicml-streaming (py1e, and py1br for shuffle quality) and
HF ``datasets`` (buffer shuffle, through torchdata's ``StatefulDataLoader``), in one run on the same
records (64 shards sorted by class, window / block / buffer of 8 shards' records for every system):
records repeated or lost after a real SIGKILL mid-epoch resumed with the same and another worker
count, resume cost, shuffle quality, throughput at 0 and 4 workers.

Ours runs in this venv; the peers in ``.bench-venv`` (litdata and mosaicml-streaming would replace
this project's torch): ``benchmarks/stream_peers.py`` is run there once per system and task.

    python -m benchmarks.cases_stream_peers --records 100000
    python -m benchmarks.cases_stream_peers --records 1000000 --resume-only --systems ours litdata mosaic
    python -m benchmarks.cases_stream_peers --full --scratch /var/tmp/peers-1e7

Each resume runs ``--repeat`` times (3 unless told), a fresh process each; the table gives the medians.
``--full`` is issue 27's run at 10^7 records (unless ``--records`` says otherwise): ours, ours-arrow, litdata and
Mosaic, their uninterrupted epochs and every kill and resume, with the targets (ours ahead of litdata to the first
batch in every pairing). ``--scratch DIR`` keeps the shards in DIR (a directory per record count) and reuses them
when a marker written after the last shard says they are complete: the writers run once (litdata's takes about
431 s at 10^7), and a measuring run can be made later on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from benchmarks.figures import Mode

ROOT = Path(__file__).resolve().parent.parent
BENCH_PYTHON = ROOT / ".bench-venv" / "bin" / "python"
SYSTEMS = ("ours", "ours-arrow", "litdata", "mosaic", "mosaic-py1br", "hf",
           "ours-jsonl", "ours-tar", "ours-mds", "ours-litdata")  # fmt: skip
# Our other readers: an uninterrupted epoch each (throughput and order), on the same records.
THROUGHPUT_ONLY = ("ours-jsonl", "ours-tar", "ours-mds", "ours-litdata")
# The shards a system reads that another system's writer makes (ours-mds reads Mosaic's MDS, ours-litdata litdata's).
WRITTEN_BY = {"litdata": "litdata", "mosaic": "mosaic", "mosaic-py1br": "mosaic", "ours-mds": "mosaic",
              "ours-litdata": "litdata"}  # fmt: skip
NEEDS_PEERS = ("litdata", "mosaic", "mosaic-py1br", "hf", "ours-mds", "ours-litdata")
BATCH, CLASSES, SHARDS = 256, 10, 64
KILLS = ((0, (0, 2)), (2, (2, 0, 4)))  # workers of the killed run, workers of each resume from its checkpoint
FULL_RECORDS = 10**7
FULL_SYSTEMS = ("ours", "ours-arrow", "litdata", "mosaic", "hf")
HF_MAX_RECORDS = 10**6  # above it the full run leaves HF out, saying why
HF_LEFT_OUT = ("left out above 10^6 records: HF datasets reads about 4,000 records/s here, so its half epoch before "
               "the kill alone takes about 20 minutes at 10^7, its epochs and resumes hours")  # fmt: skip
# The system whose writer makes the shards each system reads (HF reads our parquet).
WRITER = {**WRITTEN_BY, "hf": "ours"}


def _command(system: str, root: Path, records: int, name: str) -> tuple[list[str], dict[str, str]]:
    ours = system.startswith("ours")
    python = sys.executable if ours else str(BENCH_PYTHON)
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")} if ours else {
        key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # fmt: skip
    return [python, str(ROOT / "benchmarks" / "stream_peers.py"), system, str(root), str(records), name], environment


def task(system: str, root: Path, records: int, name: str) -> dict[str, Any]:
    command, environment = _command(system, root, records, name)
    started = time.perf_counter()
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=environment, timeout=3000)
    print(f"    {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def resume_task(system: str, root: Path, records: int, name: str, repeat: int) -> dict[str, Any]:
    """The resume ``name`` run ``repeat`` times, a fresh process each (a shared machine's load moves one run's
    figures): the median time to the first batch, CPU and memory, and the most records repeated or lost."""
    runs = [task(system, root, records, name) for _ in range(repeat)]
    failed = next((run for run in runs if "error" in run or "refused" in run), None)
    if failed is not None:
        return failed
    result = {**runs[0], "runs": repeat}
    for key in ("first_batch_s", "first_batch_cpu_s", "rss_mib"):
        result[key] = float(np.median([run[key] for run in runs]))
    for key in ("repeated", "lost"):
        if key in result:
            result[key] = max(run[key] for run in runs)
    return result


def kill_mid_epoch(system: str, root: Path, records: int, workers: int) -> dict[str, Any]:
    """Start a training process with ``workers`` workers and SIGKILL its process group (workers
    included) as soon as it reports half an epoch of batches: the kill lands wherever the process
    is, between two of its checkpoints or inside one."""
    command, environment = _command(system, root, records, f"train-{workers}")
    half = records // BATCH // 2
    with open(root / f"{system}.train{workers}.log", "w") as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=environment,
                                 start_new_session=True)  # fmt: skip
        stdout = cast(IO[str], child.stdout)
        watchdog = threading.Timer(3000, os.killpg, (child.pid, signal.SIGKILL))  # a hung run does not hang the bench
        watchdog.start()
        reported = 0
        for line in stdout:
            if not line.strip().isdigit():
                break  # "epoch-end": the epoch finished before the kill
            reported = int(line)
            if reported >= half:
                os.killpg(child.pid, signal.SIGKILL)
                break
        reported = max([reported, *(int(v) for v in stdout.read().split() if v.isdigit())])
        child.wait()
        watchdog.cancel()
    if child.returncode != -signal.SIGKILL or reported < half:
        return {"error": f"not killed mid-epoch (exit status {child.returncode}, {reported} batches reported)"}
    return {"batch": reported}


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


def run(
    records: int,
    systems: tuple[str, ...],
    resume_only: bool = False,
    kills: tuple[Any, ...] = KILLS,
    repeat: int = 1,
    epochs: bool = True,
    scratch: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Every system on the same records; ``resume_only``: only the resume cost, from a checkpoint at
    half an epoch (``stream_peers.half_state``), at 0 workers. ``kills``: (workers of the killed run,
    workers of each resume). ``repeat``: each resume's runs (``resume_task``). ``epochs=False``: no
    uninterrupted epoch (quality and throughput), the kills and resumes alone (at 10^7 the epochs at 0 and
    4 workers take minutes a system). ``scratch``: the shards are kept in ``scratch/records-N`` and reused
    (``stream_peers.written``); checkpoints, manifests and logs stay in this run's temporary directory."""
    results: dict[str, dict[str, Any]] = {}
    written: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        store = root if scratch is None else scratch / f"records-{records}"
        store.mkdir(parents=True, exist_ok=True)

        def shards(writer: str) -> dict[str, Any]:
            """``writer``'s shards written (or reused) once in the run, and seen under ``root``."""
            if writer not in written:
                written[writer] = task(writer, store, records, "write")
                directory = written[writer].get("shards")
                if store != root and directory is not None:
                    (root / directory).symlink_to(store / directory, target_is_directory=True)
            return {k: v for k, v in written[writer].items() if k == "error"}

        for system in systems:
            if resume_only and (system == "mosaic-py1br" or system in THROUGHPUT_ONLY):
                continue  # shuffle quality and throughput only: no resume of their own
            print(f"  {system} ...", file=sys.stderr, flush=True)
            result: dict[str, Any] = shards(WRITER.get(system, system))
            if not resume_only and epochs:
                epoch = task(system, root, records, "epoch")
                order = epoch.pop("order", None)
                result.update(epoch)
                if order is not None:
                    result.update(quality(order, records))
                    result["epoch_records"] = len(order)
            if system == "mosaic-py1br" or system in THROUGHPUT_ONLY:
                results[system] = result  # shuffle quality and throughput only
                continue
            if resume_only:
                result.update({f"half_{k}": v for k, v in task(system, root, records, "half").items()})
                resumed_half = resume_task(system, root, records, "resume-half-0", repeat)
                result.update({f"resume_{k}": v for k, v in resumed_half.items()})
            for killed, resumed in () if resume_only else kills:
                result.update(
                    {f"kill{killed}_{k}": v for k, v in kill_mid_epoch(system, root, records, killed).items()}
                )
                for workers in resumed:
                    resume = resume_task(system, root, records, f"resume-w{killed}-{workers}", repeat)
                    result.update({f"kill{killed}_to{workers}_{k}": v for k, v in resume.items()})
            results[system] = result
    for writer, outcome in written.items():
        how = "reused" if outcome.get("reused") else f"written in {outcome.get('write_s', 0):.1f} s"
        print(f"  shards of {writer}: {outcome.get('error', how)}", file=sys.stderr, flush=True)
    return results


def full_systems(records: int, systems: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The full run's systems at ``records``, and those left out with the reason (HF above 10^6)."""
    if records <= HF_MAX_RECORDS or "hf" not in systems:
        return systems, {}
    return tuple(s for s in systems if s != "hf"), {"hf": HF_LEFT_OUT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cases_stream_peers", description=__doc__)
    parser.add_argument("--records", type=int, help=f"100000, or {FULL_RECORDS} with --full")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS,
                        help=f"every system, or with --full {' '.join(FULL_SYSTEMS)} (HF only up to 10^6)")  # fmt: skip
    parser.add_argument("--full", action="store_true",
                        help="issue 27's run at 10^7: every kill and resume, the epochs, the targets")  # fmt: skip
    parser.add_argument("--resume-only", action="store_true", help="only the resume cost at 0 workers (for 10^6+)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each resume, a fresh process each: the median")
    parser.add_argument("--no-epoch", action="store_true", help="the kills and resumes alone: no quality, no records/s")
    parser.add_argument("--scratch", type=Path, help="keep the shards here and reuse them (a directory per N)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.full and (args.resume_only or args.no_epoch):
        parser.error("--full runs the epochs and every kill and resume: not with --resume-only or --no-epoch")
    records = args.records or (FULL_RECORDS if args.full else 100_000)
    if records < 2 * BATCH:
        parser.error(f"--records must be at least {2 * BATCH} (a kill at half an epoch of {BATCH}), got {records}")
    systems, left_out = tuple(args.systems or (FULL_SYSTEMS if args.full else SYSTEMS)), {}
    if args.full:
        systems, left_out = full_systems(records, systems)
    scratch = None if args.scratch is None else args.scratch.resolve()
    results = run(records, systems, args.resume_only, repeat=args.repeat, epochs=not args.no_epoch, scratch=scratch)
    for system, result in results.items():
        print(system, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))
    from benchmarks.__main__ import markdown
    from benchmarks.figures import Figures

    kills = () if args.resume_only else KILLS
    table = rows(results, records, kills, args.resume_only, left_out)
    print(markdown(Figures(rows=table, checks=checks(results, kills) if args.full else [])))
    return 0


def _outcome(result: dict[str, Any], prefix: str) -> tuple[float | None, str]:
    """(records repeated + lost, what happened) of one resume after a kill."""
    if f"{prefix}_refused" in result or f"{prefix}_error" in result:
        return None, result.get(f"{prefix}_refused") or result[f"{prefix}_error"]
    if f"{prefix}_lost" not in result:
        return None, "not run"
    return result[f"{prefix}_repeated"] + result[f"{prefix}_lost"], (
        f"{result[f'{prefix}_repeated']} repeated, {result[f'{prefix}_lost']} lost"
    )


def figure(mode: Mode, run_case: Any, figures: Any) -> None:
    """``python -m benchmarks --only stream-peers`` (the peers need ``.bench-venv``, ``make bench-venv``):
    2*10^4 records, the kills and resumes, quality and throughput of every reader; with --full the run of
    ``python -m benchmarks.cases_stream_peers --full`` (10^7 records, its targets; the shards written afresh);
    ``--smoke`` runs ours alone, one kill and one resume. The same table at another size:
    ``python -m benchmarks.cases_stream_peers --records N`` (docs/streaming.md)."""
    systems: tuple[str, ...] = FULL_SYSTEMS if mode.full else SYSTEMS
    skipped = ""
    if mode.smoke:
        skipped = "not run in the smoke pass (it checks that the figure runs; the peers need .bench-venv)"
    elif not BENCH_PYTHON.exists():
        skipped = f"{BENCH_PYTHON} is absent (make bench-venv)"
    if skipped:
        print(f"  stream-peers: litdata, Mosaic and HF skipped: {skipped}", file=sys.stderr, flush=True)
        systems = ("ours",) if mode.smoke else tuple(s for s in systems if s not in NEEDS_PEERS)
    # quick: a few minutes (HF reads about 2,000 records/s here); smoke: 32 batches, killed at the 16th
    records = mode.pick(quick=20_000, full=FULL_RECORDS, smoke=8_192)
    kills = mode.pick(quick=KILLS, smoke=((2, (0,)),))
    systems, left_out = full_systems(records, systems) if mode.full else (systems, {})
    results = run(records, systems, kills=kills, repeat=mode.pick(quick=1, full=3, smoke=1))
    figures.rows += rows(results, records, kills, False, left_out)
    if mode.full:
        figures.checks += checks(results, kills)


def checks(results: dict[str, dict[str, Any]], kills: tuple[Any, ...]) -> list[Any]:
    """Issue 27's item 2: our parquet and Arrow readers' resume to the first batch ahead of litdata's in every
    pairing, and every resume of ours exact."""
    from benchmarks.figures import Check

    found: list[Any] = []
    for system in ("ours", "ours-arrow"):
        if system not in results:
            continue
        for killed, resumed in kills:
            for workers in resumed:
                prefix = f"kill{killed}_to{workers}"
                ours, theirs = (results.get(s, {}).get(f"{prefix}_first_batch_s") for s in (system, "litdata"))
                value, outcome = _outcome(results[system], prefix)
                if ours is None or theirs is None:
                    peer = _outcome(results.get("litdata", {}), prefix)[1]
                    measured, met = f"not measured (ours: {outcome}; litdata: {peer})", False
                else:
                    measured, met = f"{ours:.3f} s against {theirs:.3f} s ({theirs / ours:.2f}×)", ours < theirs
                found.append(Check(f"{system}, {killed}→{workers} workers: first batch after a resume before "
                                   "litdata's", measured, met))  # fmt: skip
                found.append(Check(f"{system}, {killed}→{workers} workers: the resume exact", outcome, value == 0))
    return found


def rows(
    results: dict[str, dict[str, Any]],
    records: int,
    kills: tuple[Any, ...],
    resume_only: bool,
    left_out: dict[str, str] | None = None,
) -> list[Any]:
    """One table of a run: per system, each kill's records repeated + lost, the resume's time to its first
    batch (and its CPU time), the state's size, the three quality figures and the records/s; a system in
    ``left_out`` has one row, saying why."""
    from benchmarks.figures import Row

    name = f"streams side by side, {records:,} class-sorted records"
    table: list[Any] = []
    for system in SYSTEMS:
        if system in (left_out or {}):
            table.append(Row(name, "records/s, 0 workers", system, None, "rec/s", note=(left_out or {})[system]))
            continue
        if system not in results:
            continue  # not asked for, or skipped (the run says why on stderr)
        result = results[system]
        if system not in THROUGHPUT_ONLY and system != "mosaic-py1br":
            for killed, resumed in kills:
                for workers in resumed:
                    value, note = _outcome(result, f"kill{killed}_to{workers}")
                    checkpoint = result.get(f"kill{killed}_to{workers}_checkpoint_batch", "?")
                    note = (
                        f"killed at batch {result.get(f'kill{killed}_batch', '?')}, resumed from {checkpoint}: {note}"
                    )
                    table.append(Row(name, f"SIGKILL at {killed} workers, resumed at {workers}: records "
                                     "repeated + lost", system, value, "", note=note))  # fmt: skip
            pairings = (
                [("resume", "0→0 (half an epoch)")]
                if resume_only
                else [
                    (f"kill{killed}_to{workers}", f"{killed}→{workers}")
                    for killed, resumed in kills
                    for workers in resumed
                ]
            )
            for prefix, pairing in pairings:
                cpu, runs = result.get(f"{prefix}_first_batch_cpu_s"), result.get(f"{prefix}_runs", 1)
                note = (
                    ""
                    if cpu is None
                    else f"CPU {cpu:.3f} s (this process)" + (f", median of {runs} runs" if runs > 1 else "")
                )
                table.append(Row(name, f"resume {pairing}: fresh process to the first batch", system,
                                 result.get(f"{prefix}_first_batch_s"), "s", result.get(f"{prefix}_rss_mib"),
                                 note=note))  # fmt: skip
            prefix = pairings[0][0]
            table.append(Row(name, "state size (pickled)", system, result.get(f"{prefix}_state_bytes"), "B"))
        if resume_only:
            continue
        error = result.get("error", "")
        table.append(Row(name, "P(batch-mates share a class) (ideal 0.10)", system, result.get("same_class_mates"), "",
                         note=error))  # fmt: skip
        table.append(Row(name, "class TV of the first 10 batches (ideal 0)", system, result.get("first_tv"), ""))
        table.append(Row(name, "Mosaic entropy (higher is better)", system, result.get("mosaic_entropy"), "bits"))
        for workers in (0,) if system == "mosaic-py1br" else (0, 4):
            cpu_rate = result.get("cpu_rate_0") if workers == 0 else None
            table.append(Row(name, f"records/s, {workers} workers", system, result.get(f"rate_{workers}"), "rec/s",
                             note="" if cpu_rate is None else f"{cpu_rate:,.0f} per CPU s"))  # fmt: skip
    return table


if __name__ == "__main__":
    sys.exit(main())
