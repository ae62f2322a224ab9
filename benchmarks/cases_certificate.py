"""What the data certificate (``STATEFUL_SAMPLER_CERTIFICATE``) adds to each batch (issue 28, item 4).

The same epoch of an image-sized sample (3x32x32 floats made from a uint8 array, as a decoded CIFAR image
is: the dataset side of a cheap real loader) in batches of 64 through a plain ``DataLoader`` (the
reference time per batch), through ``ResumableLoader``, and through ``ResumableLoader`` with the
certificate written. Times are the loading thread's CPU time (``time.thread_time``, torch on one thread), so
that time the process spends descheduled on a shared machine is not counted. Systems run in interleaved
rounds; each figure is the best round, with the median. The certificate's cost is the time spent in its
hooks (timed around each call), beside the plain loader's batch: the difference of two epochs' times is
within their noise. The timing itself (two ``thread_time`` system calls a hook call, about 1.2 µs) is
measured the same way around an empty hook in the same rounds and taken off; the raw figure is printed too.
``python -m benchmarks.cases_certificate`` prints the result as JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import median
from time import thread_time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import isolated
from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.certificate.writer import CertificateWriter
from stateful_sampler.hooks import add_batch_hook, add_pass_start_hook, add_state_hook, add_state_loaded_hook

PLAIN = "plain DataLoader"
RESUMABLE = "ResumableLoader"
CERTIFIED = "ours: ResumableLoader + certificate"
BATCH, EPOCHS = 64, 3  # epochs a round: a run's writer is set up once, as a process's is


class Images(Dataset):
    """A uint8 image turned into a normalised float tensor: what a decoded-image dataset does per sample
    (``size`` records over a pool of 64 distinct images, so a large side stays small in memory)."""

    def __init__(self, size: int, side: int = 32) -> None:
        self.size = size
        self.images = np.random.default_rng(0).integers(0, 256, (64, 3, side, side), dtype=np.uint8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.images[index % 64]).float().div_(255)


def _epoch_seconds(loader: Iterable[Any]) -> float:
    started = thread_time()
    for _ in range(EPOCHS):
        for _ in loader:
            pass
    return thread_time() - started


class _Timed:
    """A hook that adds the time spent in it to ``spent``: the certificate's own cost, measured where it is paid."""

    def __init__(self, hook: Callable[..., None], spent: list[float]) -> None:
        self.hook, self.spent = hook, spent

    def __call__(self, *args: Any) -> None:
        started = thread_time()
        self.hook(*args)
        self.spent[0] += thread_time() - started


def _certified(dataset: Images, prefix: Path, spent: list[float]) -> tuple[ResumableLoader, Callable[[], None]]:
    loader = ResumableLoader(DataLoader(dataset, sampler=StatefulSampler(dataset), batch_size=BATCH), rng_states=False)
    writer = CertificateWriter(prefix, loader.sampler)
    removers = [add_state_loaded_hook(_Timed(writer.state_loaded, spent)),
                add_pass_start_hook(_Timed(writer.pass_started, spent)), add_batch_hook(_Timed(writer.batch, spent)),
                add_state_hook(_Timed(writer.state_taken, spent))]  # fmt: skip

    def remove() -> None:
        for remover in removers:
            remover()
        writer.close()

    return loader, remove


def per_batch_overhead(size: int, rounds: int, side: int = 32) -> dict[str, Any]:
    """µs per batch of each system over ``rounds`` interleaved rounds of ``EPOCHS`` epochs of ``size`` samples."""
    torch.set_num_threads(1)  # all of the loader's work on the thread whose CPU time is measured
    dataset = Images(size, side)
    batches = -(-size // BATCH) * EPOCHS
    times: dict[str, list[float]] = {PLAIN: [], RESUMABLE: [], CERTIFIED: []}
    in_hooks: list[float] = []
    timing: list[float] = []  # the same timing around an empty hook: what measuring a hook call costs
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(rounds):
            plain = DataLoader(dataset, sampler=StatefulSampler(dataset), batch_size=BATCH)
            times[PLAIN].append(_epoch_seconds(plain) / batches * 1e6)
            resumable = ResumableLoader(DataLoader(dataset, sampler=StatefulSampler(dataset), batch_size=BATCH),
                                        rng_states=False)  # fmt: skip
            times[RESUMABLE].append(_epoch_seconds(resumable) / batches * 1e6)
            empty = [0.0]
            remove_empty = add_batch_hook(_Timed(lambda *_: None, empty))
            try:
                _epoch_seconds(resumable)
            finally:
                remove_empty()
            timing.append(empty[0] / batches * 1e6)
            spent = [0.0]
            certified, remove = _certified(dataset, Path(folder) / f"round{round_index}", spent)
            try:
                times[CERTIFIED].append(_epoch_seconds(certified) / batches * 1e6)
            finally:
                remove()
            in_hooks.append(spent[0] / batches * 1e6)
        written = sum(path.stat().st_size for path in Path(folder).glob("round0.rank*"))
    best = {name: min(values) for name, values in times.items()}
    raw = min(in_hooks)  # the epoch-time difference is within the rounds' noise on a shared machine
    added = raw - min(timing)
    return {
        "size": size,
        "side": side,
        "batch": BATCH,
        "us_per_batch": best,
        "us_per_batch_median": {name: median(values) for name, values in times.items()},
        "certificate_us_per_batch": added,
        "certificate_us_per_batch_median": median(in_hooks) - median(timing),
        "certificate_us_per_batch_raw": raw,
        "timing_us_per_call": min(timing),
        "epoch_difference_us_per_batch": best[CERTIFIED] - best[RESUMABLE],
        "certificate_percent_of_plain": 100 * added / best[PLAIN],
        "certificate_percent_of_plain_raw": 100 * raw / best[PLAIN],
        "bytes_per_step": (written - 8) / batches,  # the magic, then one start record and the steps
    }


def per_batch_overhead_fresh(size: int, rounds: int, side: int) -> dict[str, Any]:
    """``per_batch_overhead`` in a fresh interpreter, as every benchmark case runs."""
    params = {"size": size, "rounds": rounds, "side": side}
    return isolated.run("benchmarks.cases_certificate", "per_batch_overhead", params)


def figure(mode: Any, run_case: Any, figures: Any) -> None:
    """``python -m benchmarks --only certificate``: µs per batch beside a plain DataLoader, and the 1% target."""
    from benchmarks.figures import Check, Row

    name = f"certificate: CPU µs a batch of {BATCH} (best round), float samples from uint8 images, num_workers=0"
    for side, batches in ((32, 200), (224, 30)):
        size = mode.pick(quick=BATCH * batches, smoke=BATCH * 2)
        result = per_batch_overhead_fresh(size, mode.pick(quick=5, full=9, smoke=1), side)
        case = f"3x{side}x{side}, N={size}"
        for system, micros in result["us_per_batch"].items():
            note = f"median {result['us_per_batch_median'][system]:.4g} µs"
            if system == CERTIFIED:
                note += (f"; {result['certificate_us_per_batch']:.2f} µs a batch in the certificate's hooks "
                         f"(median {result['certificate_us_per_batch_median']:.2f}), "
                         f"{result['certificate_percent_of_plain']:.2f}% of the plain DataLoader's batch "
                         f"(timed raw: {result['certificate_us_per_batch_raw']:.2f} µs, "
                         f"{result['certificate_percent_of_plain_raw']:.2f}%, of which timing "
                         f"{result['timing_us_per_call']:.2f} µs); "
                         f"{result['bytes_per_step']:.0f} B a step")  # fmt: skip
            figures.rows.append(Row(name, case, system, micros, "µs/batch", note=note))
        percent = result["certificate_percent_of_plain"]
        figures.checks.append(
            Check(f"{case}: the certificate adds ≤ 1% to the loader's time per batch", f"{percent:.2f}%", percent <= 1)
        )


CASES = {"per_batch_overhead": per_batch_overhead}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in CASES:
        isolated.child(CASES, sys.argv[1], json.loads(sys.argv[2]))
    else:
        print(json.dumps(per_batch_overhead(*(json.loads(arg) for arg in sys.argv[1:]))))
