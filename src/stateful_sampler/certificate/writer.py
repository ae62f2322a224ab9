"""The writer: follows a process's training loader through the core's hooks and appends its steps.

It follows the first ``StatefulSampler`` whose batch the training loop receives: through a
``ResumableLoader``'s batch hook, or ``SamplerCheckpoint``'s trainer observer (``certificate.trainer``),
which reports Lightning's train batches only (a validation loader is not recorded). At a pass's first step it
takes the pass's layout (``sampler.pass_layout``); each step's records come from the block of the order the
sampler itself drew (``sampler.drawn_records``), or, when the sampler no longer holds it, from the order's
public pieces (``PassRecords`` on its strategy, order, seed and size) a block of batches at a time. A
``ShardedStream``'s come from ``stream.global_records``. A sampler's steps are counted as they come and
written up to ``WRITE_STEPS`` at a time (packed by NumPy, hashed whole and written with one ``write(2)``), and
always before a checkpoint record and at a pass's end: a ``kill -9`` loses only steps after the rank's latest checkpoint,
which a resume supersedes.

A process's first pass writes its start record: fresh (step 0, or the file was empty), resumed (a
``ResumableLoader.load_state_dict`` came first, or the sampler's first pass here begins past the start: the
step after the one that ended at that position), or continued without the loader state restored (appended
to a certificate after its latest checkpoint, and marked so: the run then differs from one that restored it).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.certificate.format import (
    MAGIC,
    ZERO_DIGEST,
    RankFile,
    meta_record,
    padding_bit,
    rank_files,
    rank_path,
    read_rank_file,
    seal,
    step_records,
)
from stateful_sampler.certificate.run import last_checkpoint_step, resume_step
from stateful_sampler.errors import CertificateError
from stateful_sampler.order.layout import EpochLayout
from stateful_sampler.records import PassRecords
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.state import IDENTITY_FIELDS

_BLOCK_BATCHES = 64  # batches whose records are computed in one NumPy call
_MIN_BLOCK = 4096
WRITE_STEPS = 256  # steps written at once (and at every state taken, a pass's end and exit): a block's NumPy calls
# and its one link cost as much as dozens of steps, so a long block makes them cheap (about 150 KB at 64 keys a step)


class CertificateWriter:
    """Appends one process's steps to the certificate ``prefix`` (its rank's file ``prefix.rank{r}``), of
    ``order`` (a ``StatefulSampler``; default: the first whose batch the training loop receives)."""

    def __init__(self, prefix: str | os.PathLike[str], order: StatefulSampler | None = None) -> None:
        self.prefix = Path(prefix)
        self._given = order
        self._file: FileAppend | None = None
        self._begin()

    def _begin(self) -> None:
        """The state of a writer that has written nothing in this process yet."""
        self._sampler: Any = None  # the StatefulSampler or ShardedStream followed
        self._records: PassRecords | None = None
        self._layout: EpochLayout | None = None  # the pass under way's, from where it began
        self._blocks: list[tuple[int, int, np.ndarray]] = []  # local start, stop and keys (padding marked) of the
        # blocks that hold the pending steps' records: taken while the sampler still holds them
        self._per_batch = 1  # records per batch of the pass under way
        self._facts = (0, 0, 1, 0, 0, 0)  # the pass's epoch, rank, world size, segment start, length, local length
        self._position_after: Any = None  # the pass's layout's, for this rank: a step's global position after it
        self._pass_steps = 0  # steps of this rank's pass under way (its last one is written at once)
        self._written = 0  # the count (in the pass under way) of the last step written
        self._counted = 0  # ... and of the last step counted: the steps between are pending, one after another
        self._due = 0  # the count at which the next block of keys is taken (or the pending steps written)
        self._marks_repeats: bool | None = None  # whether the order's strategy marks repeats (asked once)
        self._loader: Any = None  # the loader whose next steps need only be counted (no new pass since)
        self._room: np.ndarray | None = None  # the records of the block being written, kept from block to block
        self._key_bytes = 8  # the segment's key width: 4 where every record is below 2**31
        self._unsealed: list[bytes] = []  # the records written since the file's last link, which the next covers
        self._stream_pass: tuple[int, int] = (-1, 0)  # a stream's pass under way: its epoch and origin
        self._capacity = 1
        self._next_step = 0
        self._digest = ZERO_DIGEST
        self._position: tuple[int, int] = (0, 0)  # (epoch, position) after the last step written
        self._pending_resume: dict[str, Any] | None = None
        self._warned = False
        if self._given is not None:  # last: it sets the fields that say how the order is followed
            self._follow(self._given)

    # -- the core's hooks

    def state_loaded(self, loader: Any, sampler_state: dict[str, Any]) -> None:
        """A resume: the next pass starts a segment at the step after the one that ended at this state."""
        if self._sampler is None or loader.sampler is self._sampler:
            self._pending_resume = sampler_state

    def pass_started(self, order: Any) -> None:
        """A pass of the order followed starts: its next step is checked for a new layout. Also says when an
        order the certificate cannot follow is the first to start a pass."""
        if order is self._sampler:
            self._loader = None
        elif self._sampler is None and not _followable(order):
            self._warn_once(order)

    def batch(self, loader: Any, batch: Any, consumed: int) -> None:
        """One step of a ``ResumableLoader``, the ``consumed``-th of its pass."""
        if loader is self._loader:  # the usual step: counted, written with its block (the fewer objects it
            self._counted = consumed  # touches, the fewer of the CPU's cache misses it pays between batches)
            if consumed >= self._due:
                self._catch_up()
            return
        order = loader.sampler
        if order is self._sampler or (self._sampler is None and _followable(order)):
            if isinstance(order, StatefulSampler):
                self._step(order, consumed, loader)
                self._loader = loader if self._layout is not None and order.pass_layout is self._layout else None
            else:
                self._stream_step(order, consumed, loader)

    def trained(self, order: Any) -> None:
        """One step of ``order``'s pass (a ``StatefulSampler`` or a ``ShardedStream``) that a loop without a
        ``ResumableLoader`` (Lightning's) trained on: its count in the pass is this writer's own."""
        if order is not self._sampler and self._sampler is not None:
            return
        if isinstance(order, StatefulSampler):
            self._step(order, self._counted + 1 if order.pass_layout is self._layout else 1, order)
        elif _followable(order):
            same_pass = self._stream_pass == (order.epoch, order.position)
            self._stream_step(order, self._counted + 1 if same_pass else 1, order)

    def state_taken(self, loader: Any, consumed: int) -> None:
        """A checkpoint is being taken: record where, so that a process restarted without restoring the
        loader state is placed after it."""
        if loader.sampler is self._sampler:
            self.checkpoint_taken()

    def checkpoint_taken(self) -> None:
        """Record a checkpoint of the state after the last step trained (every step before it written)."""
        if self._file is None:
            return
        self._flush()
        epoch, position = self._position
        entry = {"kind": "checkpoint", "step": self._next_step, "epoch": epoch, "position": position,
                 "time_ns": time.time_ns()}  # fmt: skip
        self._write_meta(entry)

    def close(self) -> None:
        if self._file is not None:
            self._flush()
            self._file.close()
            self._file = None

    def end_segment(self) -> None:
        """The fit that wrote the last steps is over (Lightning's teardown): the next step, of a later fit in this
        process over loaders of its own, opens a segment as a new process would, placed by where its order
        starts (a resume from a checkpoint supersedes the steps after it)."""
        self.close()
        self._begin()

    # -- the pieces

    def _step(self, order: StatefulSampler, consumed: int, batched: Any) -> None:
        """A step of a sampler's pass; its pass's first opens the pass. ``batched`` (the loader, or the sampler)
        says the batch size, read once a pass: a loader's is a walk through its wrappers."""
        layout = order.pass_layout
        if layout is None:
            return
        if layout is not self._layout:
            self._flush()  # the previous pass's steps, with its layout
            self._pass_began(order, layout, batched.batch_size)
        self._later(consumed)

    def _stream_step(self, stream: Any, consumed: int, loader: Any) -> None:
        """One step of a ``ShardedStream``'s pass: a pass is told apart by its epoch and origin, or by its count
        starting again."""
        if not stream.pass_begun:
            return
        identity = (stream.epoch, stream.position)
        if identity != self._stream_pass or consumed <= self._counted:
            self._flush()
            self._stream_pass = identity
            self._pass_began(stream, stream.layout(), loader.batch_size)
        self._later(consumed)

    def _later(self, consumed: int) -> None:
        """Count a step of the pass under way (a block's steps are consecutive). Written one at a time, between
        batches whose work has evicted the writer from the CPU's caches, a step costs several times more than
        in a block."""
        if consumed != self._counted + 1:
            self._flush()
            self._written = self._counted = consumed - 1
        self._counted = consumed
        if consumed >= self._due:
            self._catch_up()

    def _catch_up(self) -> None:
        """Take the blocks of keys the steps counted reach into; write the pending steps once there are a
        block of them, or at the pass's end. Then say at which count this is due again: the first step that
        reaches past the blocks taken (the sampler holds its last two blocks, so none is missed)."""
        counted, per_batch = self._counted, self._per_batch
        self._cover(min(counted * per_batch, self._facts[5]))
        if counted - self._written >= WRITE_STEPS or counted >= self._pass_steps:
            self._flush()
        else:
            self._due = min(self._blocks[-1][1] // per_batch + 1 if self._blocks else counted + 1,
                            self._written + WRITE_STEPS, self._pass_steps)  # fmt: skip

    def _cover(self, stop: int) -> None:
        """Take the blocks of keys that hold this rank's local positions from the first pending step's to ``stop``."""
        blocks = self._blocks
        start = blocks[-1][1] if blocks else min(self._written * self._per_batch, self._facts[5])
        while start < stop:
            blocks.append(self._key_block(start, stop))
            start = blocks[-1][1]

    def _flush(self) -> None:
        """Write the steps counted and not yet written: packed into one block by NumPy, the block sealed with the
        chain's next link, in one ``write(2)``."""
        written, counted = self._written, self._counted
        if counted <= written:
            return
        epoch, _, world_size, origin, length, local_length = self._facts
        per_batch, capacity, steps = self._per_batch, self._capacity, counted - written
        self._cover(min(counted * per_batch, local_length))
        stride = per_batch * world_size  # global positions a step moves the ranks on, until this rank's share ends
        before = np.arange(origin + written * stride, origin + counted * stride, stride, dtype=np.int64)[:steps]
        after = before + stride
        whole = -(-local_length // per_batch) - 1 - written  # the first of these steps to reach the share's end
        for index in range(max(whole, 0), steps):  # there the layout's own rule (typically one step, a pass's last)
            start = (written + index) * per_batch
            before[index] = self._position_after(start) if start >= local_length else before[index]
            after[index] = self._position_after(min(start + per_batch, local_length))
        if per_batch > capacity:
            raise CertificateError(f"batches of {per_batch} records, over the certificate's capacity of {capacity} "
                                   f"(the order's batch size)")  # fmt: skip
        first = min(written * per_batch, local_length)
        flat = self._keys(first, min(counted * per_batch, local_length))
        if self._room is None or self._room.dtype["keys"].shape[0] != capacity:
            self._room = step_records(WRITE_STEPS, capacity, self._key_bytes)
        records = self._room[:steps]
        keys = records["keys"]
        if per_batch == capacity and counted * per_batch <= local_length:  # whole steps: the keys as they lie
            counts: Any = capacity
            keys[...] = flat.reshape(steps, capacity)
        else:
            starts = np.arange(written, counted, dtype=np.int64) * per_batch
            counts = np.clip(local_length - starts, 0, per_batch)
            places = np.arange(capacity)
            filled = places < counts[:, None]
            keys[...] = np.iinfo(keys.dtype).max  # all ones: no key
            keys[filled] = flat[((starts - first)[:, None] + places)[filled]]
        unsealed = b"".join(self._unsealed)
        self._unsealed.clear()
        block, self._digest = seal(records, self._digest, unsealed, self._next_step, epoch, before, after, counts,
                                   after == length)  # fmt: skip
        self._next_step += steps
        self._position, self._written = (epoch, int(after[-1])), counted
        del self._blocks[:-1]  # the last may hold the next steps' records too
        self._due = counted + 1  # the next step takes what it needs
        self._file.write(block.data)  # type: ignore[union-attr]

    def _pass_began(self, order: Any, layout: Any, batch_size: int | None) -> None:
        """The first step of a pass: take its layout, and write the process's start record if it is due."""
        if self._sampler is None:
            self._follow(order)
        self._layout, self._per_batch, rank = layout, batch_size or 1, order.rank
        self._blocks, self._written = [], self._counted  # a pass's first count may be any (a resume's)
        if isinstance(layout, EpochLayout):
            self._facts = (layout.epoch, rank, layout.world_size, layout.segment_start, layout.length,
                           layout.local_length(rank))  # fmt: skip
            self._position_after = functools.partial(layout.position_after, rank)
        else:  # a stream's StreamLayout: one epoch's deal from its origin, the same on every rank
            self._facts = (order.epoch, rank, layout.world_size, layout.origin, layout.size, layout.local_length)
            self._position_after = layout.position_after
        self._pass_steps = -(-self._facts[5] // self._per_batch)
        self._due = 0
        if self._file is None or self._pending_resume is not None:
            self._start(order)

    def _follow(self, order: Any) -> None:
        if not _followable(order):
            raise TypeError(f"a certificate follows a StatefulSampler or a ShardedStream, got {type(order).__name__}")
        self._sampler = order
        if isinstance(order, StatefulSampler):
            self._records = PassRecords(order.strategy, order.order, order.seed, order.size)

    def _keys(self, start: int, stop: int) -> np.ndarray:
        """This rank's records at its local positions [start, stop) of the pass, from the blocks taken."""
        pieces = [keys[max(start, begin) - begin : min(stop, end) - begin]
                  for begin, end, keys in self._blocks if begin < stop and start < end]  # fmt: skip
        return pieces[0] if len(pieces) == 1 else np.concatenate([np.empty(0, np.uint64), *pieces])

    def _key_block(self, start: int, stop: int) -> tuple[int, int, np.ndarray]:
        """The block of keys that holds local position ``start``: the block the sampler drew when it still holds
        it, else from the order's arithmetic, a block of batches at a time."""
        layout, rank, local_length = self._layout, self._facts[1], self._facts[5]
        block_stop = min(max(stop, start + max(_BLOCK_BATCHES * self._per_batch, _MIN_BLOCK)), local_length)
        if not isinstance(layout, EpochLayout):
            epoch, origin = self._stream_pass
            indices, padding = self._sampler.global_records(epoch, origin, start, block_stop)  # type: ignore[union-attr]
            records = indices.astype(f"<u{self._key_bytes}")
            records[padding] |= padding_bit(self._key_bytes)
            return start, block_stop, records
        drawn = self._sampler.drawn_records(layout, start)  # type: ignore[union-attr]
        if drawn is not None:
            block_start, records = drawn
        else:
            positions = layout.global_positions(rank, start, block_stop)
            block_start, records = start, self._records(layout.epoch, layout.pass_offsets(positions))  # type: ignore[misc]
        block_stop = block_start + records.size
        if self._marks_repeats is None:
            self._marks_repeats = self._records.marks_repeats(layout.epoch)  # type: ignore[union-attr]
        if not (self._marks_repeats or layout.pads(rank, block_start, block_stop)):
            unmarked = records.view(np.uint64) if records.dtype == np.int64 else records.astype(np.uint64)
            return block_start, block_stop, unmarked  # nothing to mark: the records' own bits, not copied
        positions = layout.global_positions(rank, block_start, block_stop)
        padding = layout.is_padding(positions) | self._records.repeats(layout.epoch, layout.pass_offsets(positions))  # type: ignore[union-attr]
        records = records.astype(f"<u{self._key_bytes}")
        records[padding] |= padding_bit(self._key_bytes)
        return block_start, block_stop, records

    def _start(self, order: Any) -> None:
        """Open this rank's file (cutting a torn tail) and write the process's start record. A sampler that
        begins its first pass in this process past its epoch's start was restored by something other than
        a ``ResumableLoader`` (``SamplerCheckpoint``, ``load_state_dict`` on the sampler): a resume from there."""
        rank, world_size = order.rank, order.num_replicas
        path = rank_path(self.prefix, rank)
        if self._file is None:
            own = _open_for_append(path)
            self._file = FileAppend(path)
            if own is None:
                self._file.write(MAGIC)
        else:  # a second start in this process (a later load): the file is ours, its mapped tail included
            own = read_rank_file(path)
        resumed, self._pending_resume = self._pending_resume, None
        epoch, origin = self._facts[0], self._facts[3]
        if resumed is None and self._next_step == 0 and (epoch, origin) != (0, 0) and _recorded(self.prefix, own, rank):
            resumed = {"epoch": epoch, "position": origin}
        found = True
        if resumed is not None:
            files = _readable_files(self.prefix, own, rank)
            first = resume_step(files, resumed["epoch"], resumed["position"])
            found = first is not None
            first = first if first is not None else self._next_step
        elif own is not None and own.segments and self._next_step == 0:
            first = last_checkpoint_step(_readable_files(self.prefix, own, rank))
        else:
            first = self._next_step
        self._digest, self._unsealed = (own.link, [own.unsealed]) if own is not None else (ZERO_DIGEST, [])
        self._capacity = max(order.batch_size or 0, self._per_batch)
        key_bytes = 4 if isinstance(order, StatefulSampler) and order.size < 1 << 31 else 8  # a stream's keys: 8
        if key_bytes != self._key_bytes:
            self._key_bytes, self._room = key_bytes, None
        state = order.state_after(0)
        start = {
            "kind": "start",
            "time_ns": time.time_ns(),
            "rank": rank,
            "world_size": world_size,
            "batch_size": order.batch_size,
            "capacity": self._capacity,
            "key_bytes": self._key_bytes,
            "start_step": first,
            "restored": resumed is not None,
            "continued": resumed is None and own is not None and bool(own.segments),
            "resumed_from": None if resumed is None else {"epoch": resumed["epoch"], "position": resumed["position"]},
            "resume_found": found,
            "identity": {"seed": order.seed, **{name: state[name] for name in IDENTITY_FIELDS if name in state}},
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        self._write_meta(start)
        self._next_step = first
        if not found:
            print(
                f"stateful-sampler certificate: the state loaded (epoch {resumed['epoch']}, position "  # type: ignore[index]
                f"{resumed['position']}) ends no step of {self.prefix}; compare will refuse it",  # type: ignore[index]
                file=sys.stderr,
            )

    def _write_meta(self, entry: dict[str, Any]) -> None:
        """Write a meta record; the next block's link covers it."""
        record = meta_record(entry)
        self._file.write(record)  # type: ignore[union-attr]
        self._unsealed.append(record)

    def _warn_once(self, order: Any) -> None:
        if not self._warned:
            self._warned = True
            print(
                f"stateful-sampler certificate: {type(order).__name__} is not a StatefulSampler; its steps are not "
                f"certified",
                file=sys.stderr,
            )


class FileAppend:
    """Appends to a file with one ``write(2)`` a block of records: they are in the kernel's page cache once it
    returns, where a ``kill -9`` of the process does not reach. (A memory map, written a step at a time, faults
    on each page's first write of a step, which costs more than the whole block's system call.)"""

    def __init__(self, path: Path) -> None:
        self._descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._descriptor, view) :]

    def close(self) -> None:
        os.close(self._descriptor)


def _open_for_append(path: Path) -> RankFile | None:
    """This rank's file as it stands, its torn tail cut off; ``None`` when there is none yet."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    own = read_rank_file(path)
    if own.valid_length < path.stat().st_size:
        os.truncate(path, own.valid_length)
    return own


def _followable(order: Any) -> bool:
    """A ``StatefulSampler``, or a ``ShardedStream`` (told by its public ``global_records``: the stream
    package is not imported for a run that has none)."""
    return isinstance(order, StatefulSampler) or callable(getattr(order, "global_records", None))


def _recorded(prefix: Path, own: RankFile | None, rank: int) -> bool:
    """Whether the certificate holds anything yet: a segment of this rank's, or another rank's file."""
    return (own is not None and bool(own.segments)) or any(
        path != rank_path(prefix, rank) for path in rank_files(prefix)
    )


def _readable_files(prefix: Path, own: RankFile | None, rank: int) -> list[RankFile]:
    """Every rank's file of the certificate (this rank's as just read); another rank's that cannot be read
    (being written, or gone) is left out."""
    files = [own] if own is not None else []
    for path in rank_files(prefix):
        if path != rank_path(prefix, rank):
            try:
                files.append(read_rank_file(path))
            except CertificateError:
                continue
    return files
