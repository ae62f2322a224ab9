"""The certificate's file: one per rank (``PATH.rank{r}``), append-only, read back whole.

After an 8-byte magic, a file is a run of records:

- a step (tag ``T``), a fixed number of bytes for a fixed batch size: the step, its epoch, the order's global
  position before and after it, this rank's key count and capacity, an end-of-epoch flag, the chain digest
  ``h_k = blake2b(h_{k-1} || step fields || keys)`` and the keys (dataset records as ``uint64``; a padding
  repeat has bit 63 set), padded to the capacity with ``UNUSED``;
- a meta record (tag ``M``, a length and JSON): a process's start (``kind: "start"``: rank, world size, the
  order's identity fields and seed, the step it starts at, and what it resumed from, if anything), or a
  checkpoint taken (``kind: "checkpoint"``: the next step, the epoch and position saved).

A process killed in the middle of a write leaves a torn last record (or zeros): a reader stops before them, and the next writer cuts them off before appending.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.errors import CertificateError

MAGIC = b"SSCERT\x00\x01"  # the format's version is the last byte
STEP_TAG, META_TAG, _UNWRITTEN = b"T", b"M", b"\x00"
_STEP = struct.Struct("<QQQQIII16s")  # step, epoch, before, after, count, capacity, flags, digest
_META_LENGTH = struct.Struct("<I")
PADDING_BIT = np.uint64(1 << 63)
UNUSED = np.uint64((1 << 64) - 1)
ZERO_DIGEST = bytes(16)
_LAST_OF_EPOCH = 1


@dataclass(frozen=True)
class Step:
    """One training step of one rank: where it sits in the order, and the records it trained on."""

    step: int
    epoch: int
    before: int  # the order's global position in the epoch before the step
    after: int  # ... and after it: what a state saved right after the step holds
    keys: np.ndarray  # uint64 records, padding repeats with PADDING_BIT set
    last_of_epoch: bool
    digest: bytes  # this rank's chain up to and including this step

    def records(self) -> list[int]:
        """The dataset records of the step (padding repeats included, unmarked)."""
        return (self.keys & ~PADDING_BIT).tolist()  # type: ignore[no-any-return]


@dataclass
class Segment:
    """What one process appended: its start record, then its steps and checkpoints in order."""

    start: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RankFile:
    path: Path
    segments: list[Segment]
    valid_length: int  # bytes up to the last whole record (a torn tail after it is ignored)


_FIELDS = struct.Struct("<QQQQ")
_UNUSED_BYTES = UNUSED.tobytes()


def chain(previous: bytes, step: int, epoch: int, before: int, after: int, keys: bytes) -> bytes:
    """The next link of a chain: ``blake2b(previous || step fields || keys)``, 16 bytes."""
    return hashlib.blake2b(previous + _FIELDS.pack(step, epoch, before, after) + keys, digest_size=16).digest()


_RECORD_HEAD = struct.Struct("<cQQQQIII16s")  # the tag, then _STEP


def write_step(buffer: Any, offset: int, previous: bytes, step: int, epoch: int, before: int, after: int,
               keys: bytes, last: bool, capacity: int) -> bytes:  # fmt: skip
    """Pack a step's record (``keys``: its uint64 keys' bytes) into ``buffer`` at ``offset``, in place:
    ``step_size(capacity)`` bytes whatever its key count. Returns its link of the chain from ``previous``
    (``chain``, with the step fields packed once for both)."""
    count = len(keys) >> 3
    digest = hashlib.blake2b(previous + _FIELDS.pack(step, epoch, before, after) + keys, digest_size=16).digest()
    _RECORD_HEAD.pack_into(buffer, offset, STEP_TAG, step, epoch, before, after, count, capacity,
                           _LAST_OF_EPOCH if last else 0, digest)  # fmt: skip
    start = offset + _RECORD_HEAD.size
    buffer[start : start + len(keys)] = keys
    if count < capacity:
        buffer[start + len(keys) : start + 8 * capacity] = _UNUSED_BYTES * (capacity - count)
    return digest


def step_size(capacity: int) -> int:
    """Bytes a step takes in the file, for up to ``capacity`` keys (the per-rank batch size)."""
    return 1 + _STEP.size + 8 * capacity


def meta_record(entry: dict[str, Any]) -> bytes:
    data = json.dumps(entry, sort_keys=True).encode()
    return META_TAG + _META_LENGTH.pack(len(data)) + data


def read_rank_file(path: Path) -> RankFile:
    """Parse one rank's file; a torn last record is left out (``valid_length`` stops before it)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateError(f"{path}: cannot read the certificate file: {error}") from error
    if not data.startswith(MAGIC):
        if data[: len(MAGIC) - 1] == MAGIC[:-1]:
            raise CertificateError(f"{path}: certificate format {data[len(MAGIC) - 1]}, this release reads {MAGIC[-1]}")
        raise CertificateError(f"{path}: not a stateful-sampler certificate (no {MAGIC[:6]!r} magic)")
    segments: list[Segment] = []
    offset = len(MAGIC)
    while offset < len(data):
        tag = data[offset : offset + 1]
        if tag == _UNWRITTEN:
            break  # zeros: a block the kernel had not filled when the writer was killed
        if tag == STEP_TAG:
            end = offset + 1 + _STEP.size
            if end > len(data):
                break
            step, epoch, before, after, count, capacity, flags, digest = _STEP.unpack_from(data, offset + 1)
            if end + 8 * capacity > len(data):
                break
            if not segments:
                raise CertificateError(f"{path}: a step at byte {offset} before any start record")
            keys = np.frombuffer(data, dtype=np.uint64, count=count, offset=end).copy()
            segments[-1].steps.append(Step(step, epoch, before, after, keys, bool(flags & _LAST_OF_EPOCH), digest))
            offset = end + 8 * capacity
        elif tag == META_TAG:
            if offset + 1 + _META_LENGTH.size > len(data):
                break
            (length,) = _META_LENGTH.unpack_from(data, offset + 1)
            end = offset + 1 + _META_LENGTH.size + length
            if end > len(data):
                break
            try:
                entry = json.loads(data[offset + 1 + _META_LENGTH.size : end])
            except ValueError as error:
                raise CertificateError(f"{path}: a corrupt record at byte {offset}: {error}") from error
            if entry.get("kind") == "start":
                segments.append(Segment(entry))
            elif segments:
                segments[-1].checkpoints.append(entry)
            offset = end
        else:
            raise CertificateError(f"{path}: a corrupt record at byte {offset} (tag {tag!r})")
    return RankFile(path, segments, offset)


def check_chain(rank_file: RankFile) -> None:
    """Refuse a file whose steps do not chain: each segment from its start's ``chain_from``."""
    for segment in rank_file.segments:
        previous = bytes.fromhex(segment.start.get("chain_from", ZERO_DIGEST.hex()))
        for step in segment.steps:
            expected = chain(previous, step.step, step.epoch, step.before, step.after, step.keys.tobytes())
            if step.digest != expected:
                raise CertificateError(f"{rank_file.path}: step {step.step} does not chain (the file was altered)")
            previous = step.digest


def rank_files(prefix: Path) -> list[Path]:
    """The files of the certificate ``prefix``: ``prefix.rank0``, ``prefix.rank1``, ..., in rank order."""
    found = []
    for candidate in prefix.parent.glob(f"{prefix.name}.rank*"):
        suffix = candidate.name[len(prefix.name) + len(".rank") :]
        if suffix.isdigit():
            found.append((int(suffix), candidate))
    return [path for _, path in sorted(found)]


def rank_path(prefix: Path, rank: int) -> Path:
    return prefix.with_name(f"{prefix.name}.rank{rank}")
