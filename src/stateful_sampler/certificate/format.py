"""The certificate's file: one per rank (``PATH.rank{r}``), append-only, read back whole.

After an 8-byte magic, a file is a run of records:

- a step (tag ``T``), a fixed number of bytes for a fixed batch size: the step, its epoch, the order's global
  position before and after it, this rank's key count and capacity, flags (the epoch's last step; the last
  step of a block), the keys (dataset records as ``uint32`` where the dataset has fewer than 2**31 records,
  else ``uint64``, as the start record says; a padding repeat has the top bit set) padded to the capacity
  with all ones, and a digest;
- a meta record (tag ``M``, a length and JSON): a process's start (``kind: "start"``: rank, world size, the
  order's identity fields and seed, the step it starts at, and what it resumed from, if anything), or a
  checkpoint taken (``kind: "checkpoint"``: the next step, the epoch and position saved).

Steps are written a block at a time, and one chain runs through the whole file: the last step of a block
carries ``h_b = sha256(h_{b-1} || every byte since the previous block's link, up to this one)`` (its first 16
bytes; ``h_0`` is zeros), its other steps zeros. So the meta records between two blocks are covered too, and a
process that appends goes on with the file's last link. One link a block, not a step: a link's cost is mostly
the call's. A process killed in the middle of a write leaves a torn or unsealed last block (or zeros): a
reader stops before it, and the next writer cuts it off before appending.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.errors import CertificateError

MAGIC = b"SSCERT\x00\x02"  # the format's version is the last byte
STEP_TAG, META_TAG, _UNWRITTEN = b"T", b"M", b"\x00"
_HEAD = struct.Struct("<cQQQQIII")  # the tag, step, epoch, before, after, count, capacity, flags
_META_LENGTH = struct.Struct("<I")
PADDING_BIT = np.uint64(1 << 63)
KEY_BYTES = (4, 8)  # a step's keys: 4 bytes each where every record is below 2**31, else 8
DIGEST_SIZE = 16
ZERO_DIGEST = bytes(DIGEST_SIZE)
_LAST_OF_EPOCH, _SEALS_BLOCK = 1, 2  # flags (``seal`` writes a step's last_of_epoch as its 0 or 1)
_NO_DIGEST = np.void(ZERO_DIGEST)  # a step that does not end its block


@dataclass(frozen=True)
class Step:
    """One training step of one rank: where it sits in the order, and the records it trained on."""

    step: int
    epoch: int
    before: int  # the order's global position in the epoch before the step
    after: int  # ... and after it: what a state saved right after the step holds
    keys: np.ndarray  # uint64 records, padding repeats with PADDING_BIT set
    last_of_epoch: bool
    digest: bytes  # the chain's link when the step ends a block (zeros otherwise)

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
    valid_length: int  # bytes up to the last whole record (a torn or unsealed tail after it is ignored)
    broken_at: int | None = None  # the first step whose block does not chain (the file was altered)
    link: bytes = ZERO_DIGEST  # the chain's last link: the last block's
    unsealed: bytes = b""  # the records after the last block (meta records), which the next link covers


def link(previous: bytes, *parts: Any) -> bytes:
    """The chain's next link: the first 16 bytes of ``sha256(previous || parts...)`` (SHA-256 runs in the CPU's
    own instructions on current x86 and Arm: about twice blake2b's speed here)."""
    hashed = hashlib.sha256(previous)
    for part in parts:
        hashed.update(part)
    return hashed.digest()[:DIGEST_SIZE]


@functools.cache
def _record_type(capacity: int, key_bytes: int) -> np.dtype:
    """A step record as NumPy lays it out: the file's bytes, packed (no alignment)."""
    return np.dtype([("tag", "S1"), ("step", "<u8"), ("epoch", "<u8"), ("before", "<u8"), ("after", "<u8"),
                     ("count", "<u4"), ("capacity", "<u4"), ("flags", "<u4"),
                     ("keys", f"<u{key_bytes}", (capacity,)), ("digest", f"V{DIGEST_SIZE}")])  # fmt: skip


def padding_bit(key_bytes: int) -> np.unsignedinteger:
    """The bit that marks a padding repeat among keys of ``key_bytes`` bytes: the top one."""
    return np.uint32(1 << 31) if key_bytes == 4 else PADDING_BIT


def widened(keys: np.ndarray) -> np.ndarray:
    """Keys read from a file as ``uint64``, a padding repeat marked by ``PADDING_BIT`` whatever their width."""
    if keys.dtype == np.uint64:
        return keys.copy()
    wide = keys.astype(np.uint64)
    marked = wide >> np.uint64(31)
    return (wide & np.uint64((1 << 31) - 1)) | (marked << np.uint64(63))


def step_records(steps: int, capacity: int, key_bytes: int = 8) -> np.ndarray:
    """Room for a block of up to ``steps`` step records of ``capacity`` keys, laid out as the file holds them:
    the writer fills a slice's ``keys`` (each row padded with all ones), then ``seal`` fills the rest (the tag
    and the capacity are set here). Kept from block to block, its pages are not faulted in again each time."""
    records = np.zeros(steps, dtype=_record_type(capacity, key_bytes))
    records["tag"], records["capacity"] = STEP_TAG, capacity
    return records


def seal(records: np.ndarray, previous: bytes, unsealed: bytes, first_step: int, epoch: int, before: np.ndarray,
         after: np.ndarray, counts: Any, last_of_epoch: np.ndarray) -> tuple[np.ndarray, bytes]:  # fmt: skip
    """Fill a block's heads (consecutive steps from ``first_step``) and seal it: its last step carries the chain's
    link from ``previous`` over the ``unsealed`` records written before it and the block. Returns the block's
    bytes (a ``uint8`` view of ``records``) and the link."""
    records["step"] = np.arange(first_step, first_step + len(records), dtype=np.uint64)
    records["epoch"], records["before"], records["after"], records["count"] = epoch, before, after, counts
    records["flags"] = last_of_epoch  # True is _LAST_OF_EPOCH
    records["flags"][-1] |= _SEALS_BLOCK
    records["digest"] = _NO_DIGEST
    data = records.view(np.uint8)
    digest = link(previous, unsealed, data[:-DIGEST_SIZE])
    data[-DIGEST_SIZE:] = np.frombuffer(digest, dtype=np.uint8)
    return data, digest


def step_size(capacity: int, key_bytes: int = 8) -> int:
    """Bytes a step takes in the file, for up to ``capacity`` keys (the per-rank batch size) of ``key_bytes``."""
    return _HEAD.size + key_bytes * capacity + DIGEST_SIZE


def meta_record(entry: dict[str, Any]) -> bytes:
    data = json.dumps(entry, sort_keys=True).encode()
    return META_TAG + _META_LENGTH.pack(len(data)) + data


def read_rank_file(path: Path) -> RankFile:
    """Parse one rank's file, checking its chain as it goes (``check_chain`` refuses a break); a torn or
    unsealed last block is left out (``valid_length`` stops before it)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateError(f"{path}: cannot read the certificate file: {error}") from error
    if not data.startswith(MAGIC):
        if data[: len(MAGIC) - 1] == MAGIC[:-1]:
            raise CertificateError(f"{path}: certificate format {data[len(MAGIC) - 1]}, this release reads {MAGIC[-1]}")
        raise CertificateError(f"{path}: not a stateful-sampler certificate (no {MAGIC[:6]!r} magic)")
    view = memoryview(data)
    segments: list[Segment] = []
    block: list[Step] = []  # the steps read since the last seal
    sealed = offset = valid = len(MAGIC)  # where the bytes the next link covers begin; the whole records' end
    previous, broken_at = ZERO_DIGEST, None
    while offset < len(data):
        tag = data[offset : offset + 1]
        if tag == _UNWRITTEN:
            break  # zeros: a block the kernel had not filled when the writer was killed
        if tag == STEP_TAG:
            if offset + _HEAD.size > len(data):
                break
            _, step, epoch, before, after, count, capacity, flags = _HEAD.unpack_from(data, offset)
            if not segments or count > capacity or segments[-1].start.get("capacity", capacity) != capacity:
                problem = "before any start record" if not segments else f"of {count} keys in {capacity} places"
                raise CertificateError(f"{path}: a corrupt step at byte {offset}: {problem}")
            key_bytes = segments[-1].start.get("key_bytes", 8)
            if key_bytes not in KEY_BYTES:
                raise CertificateError(f"{path}: a start record before byte {offset} says keys of {key_bytes!r} bytes")
            end = offset + step_size(capacity, key_bytes)
            if end > len(data):
                break
            keys = widened(np.frombuffer(data, dtype=f"<u{key_bytes}", count=count, offset=offset + _HEAD.size))
            digest = data[end - DIGEST_SIZE : end]
            block.append(Step(step, epoch, before, after, keys, bool(flags & _LAST_OF_EPOCH), digest))
            offset = end
            if flags & _SEALS_BLOCK:
                if link(previous, view[sealed : end - DIGEST_SIZE]) != digest and broken_at is None:
                    broken_at = block[0].step
                segments[-1].steps.extend(block)
                block, previous, sealed = [], digest, end
                valid = end
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
            if block:  # a block left unsealed, then more records: not what a writer leaves
                broken_at = block[0].step if broken_at is None else broken_at
                segments[-1].steps.extend(block)
                block = []
            if entry.get("kind") == "start":
                segments.append(Segment(entry))
            elif segments:
                segments[-1].checkpoints.append(entry)
            offset = valid = end
        else:
            raise CertificateError(f"{path}: a corrupt record at byte {offset} (tag {tag!r})")
    return RankFile(path, segments, valid, broken_at, previous, data[sealed:valid])


def check_chain(rank_file: RankFile) -> None:
    """Refuse a file whose chain does not hold (a record changed since it was written)."""
    if rank_file.broken_at is not None:
        raise CertificateError(f"{rank_file.path}: step {rank_file.broken_at} does not chain (the file was altered)")


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
