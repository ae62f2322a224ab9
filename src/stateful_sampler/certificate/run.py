"""What a certificate says the final weights trained on: its rank files merged, superseded steps left out.

The supersede rule: a process that starts at step k (a resume from a checkpoint taken after k steps)
replaces every step from k on that processes before it wrote. In its own rank's file that is every
earlier segment's steps from k on; a rank the resumed run no longer has (its world size is at most that
rank) is replaced by a later start of any rank. The steps left are merged by step: each global step is
every rank's keys of it, in the order's global positions (rank r's i-th key sits at ``before + i*W + r``).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.certificate.format import (
    PADDING_BIT,
    ZERO_DIGEST,
    RankFile,
    Segment,
    Step,
    check_chain,
    rank_files,
    read_rank_file,
)
from stateful_sampler.errors import CertificateError


@dataclass(frozen=True)
class GlobalStep:
    step: int
    epoch: int
    world_size: int
    batch_size: int
    before: int
    after: int
    keys: np.ndarray  # every rank's keys, in global position order

    def records(self) -> list[int]:
        """The dataset records of the step, in global position order (padding repeats included, unmarked)."""
        return (self.keys & ~PADDING_BIT).tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Run:
    """One certificate read back: its global steps in order, and every process start it records."""

    prefix: Path
    steps: list[GlobalStep]
    starts: list[dict[str, Any]]  # in time order

    @property
    def identity(self) -> dict[str, Any]:
        return dict(self.starts[0]["identity"]) if self.starts else {}

    def digest(self) -> str:
        """The global chain's last link: h_k = blake2b(h_{k-1} || epoch || step's global keys)."""
        digest = ZERO_DIGEST
        for step in self.steps:
            link = hashlib.blake2b(digest, digest_size=16)
            link.update(struct.pack("<Q", step.epoch))
            link.update(step.keys.tobytes())
            digest = link.digest()
        return digest.hex()


def _own(segments: list[Segment]) -> dict[int, tuple[Step, dict[str, Any]]]:
    kept: dict[int, tuple[Step, dict[str, Any]]] = {}
    for segment in segments:
        first = segment.start["start_step"]
        for step in [step for step in kept if step >= first]:
            del kept[step]
        for record in segment.steps:
            kept[record.step] = (record, segment.start)
    return kept


def effective(files: list[RankFile]) -> dict[int, dict[int, tuple[Step, dict[str, Any]]]]:
    """Step -> rank -> (its record, the start of the process that wrote it), superseded steps left out."""
    starts = [segment.start for rank_file in files for segment in rank_file.segments]
    by_step: dict[int, dict[int, tuple[Step, dict[str, Any]]]] = {}
    for rank_file in files:
        for step, (record, start) in _own(rank_file.segments).items():
            rank = start["rank"]
            if any(
                later["world_size"] <= rank and later["time_ns"] > start["time_ns"] and later["start_step"] <= step
                for later in starts
            ):
                continue  # a later run without this rank resumed before this step
            by_step.setdefault(step, {})[rank] = (record, start)
    return by_step


def merge(prefix: Path, files: list[RankFile]) -> Run:
    """The certificate's global steps, checked: steps 0..n-1 with no gap, each with every rank of its run."""
    steps: list[GlobalStep] = []
    for step, ranks in sorted(effective(files).items()):
        if step != len(steps):
            raise CertificateError(f"{prefix}: step {len(steps)} is missing (the next step recorded is {step})")
        writers = {rank: start for rank, (_, start) in ranks.items()}
        world_size = writers[min(writers)]["world_size"]
        if sorted(ranks) != list(range(world_size)) or {s["world_size"] for s in writers.values()} != {world_size}:
            raise CertificateError(
                f"{prefix}: step {step} has ranks {sorted(ranks)}, its run had {world_size}: a rank's file is "
                f"missing or cut short"
            )
        records = [record for _, (record, _) in sorted(ranks.items())]
        first = records[0]
        positions = np.concatenate(
            [first.before + np.arange(record.keys.size) * world_size + rank for rank, record in enumerate(records)]
        )
        keys = np.concatenate([record.keys for record in records])[np.argsort(positions, kind="stable")]
        batch_size = int(writers[0]["batch_size"] or 1)
        steps.append(GlobalStep(step, first.epoch, world_size, batch_size, first.before, first.after, keys))
    starts = sorted((segment.start for rank_file in files for segment in rank_file.segments),
                    key=lambda start: (start["time_ns"], start["rank"]))  # fmt: skip
    return Run(prefix, steps, starts)


def read_run(prefix: Path | str) -> Run:
    """Read and merge the certificate ``prefix`` (its files ``prefix.rank0``, ...), checking each file's chain."""
    prefix = Path(prefix)
    paths = rank_files(prefix)
    if not paths:
        raise CertificateError(f"{prefix}: no certificate files ({prefix.name}.rank0, ...) in {prefix.parent}")
    files = [read_rank_file(path) for path in paths]
    for rank_file in files:
        check_chain(rank_file)
    return merge(prefix, files)


def resume_step(files: list[RankFile], epoch: int, position: int) -> int | None:
    """The step a run resumed from a state at (``epoch``, ``position``) starts at: one past the latest step
    recorded that ends there (or that ends epoch ``epoch - 1``, for a state at the next epoch's start);
    0 for a state at the very start; ``None`` when no step of the certificate ends there."""
    if (epoch, position) == (0, 0):
        return 0
    ending = []
    for step, ranks in effective(files).items():
        record = next(iter(ranks.values()))[0]
        if (record.epoch, record.after) == (epoch, position):
            ending.append((2, step))
        elif position == 0 and record.epoch == epoch - 1:
            ending.append((1 if record.last_of_epoch else 0, step))  # prefer the step flagged as the epoch's end
    if not ending:
        return None
    return max(ending, key=lambda found: (found[1], found[0]))[1] + 1


def last_checkpoint_step(files: list[RankFile]) -> int:
    """The step after the latest checkpoint any rank recorded (0 when none was): where a process that appends
    without restoring the loader state is taken to continue, since the weights can only come from there."""
    latest: tuple[int, int] | None = None
    for rank_file in files:
        for segment in rank_file.segments:
            for checkpoint in segment.checkpoints:
                found = (checkpoint["time_ns"], checkpoint["step"])
                latest = found if latest is None or found > latest else latest
    return latest[1] if latest is not None else 0
