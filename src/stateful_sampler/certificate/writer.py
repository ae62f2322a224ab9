"""The writer: follows a process's training loader through the core's hooks and appends its steps.

It follows the first ``StatefulSampler`` whose batch the training loop receives: through a
``ResumableLoader``'s batch hook, or ``SamplerCheckpoint``'s trainer observer (``certificate.trainer``),
which reports Lightning's train batches only (a validation loader is not recorded). At a pass's first step it
takes the pass's layout (``sampler.pass_layout``); each step's records come from the block of the order the
sampler itself drew (``sampler.drawn_records``), or, when the sampler no longer holds it, from the order's
public pieces (``PassRecords`` on its strategy, order, seed and size) a block of batches at a time. A
``ShardedStream``'s come from ``stream.global_records``. A sampler's steps are counted as they come and
written ``WRITE_STEPS`` at a time (a slice, a hash and a pack each, then one ``write(2)``), and always before a
checkpoint record and at a pass's end: a ``kill -9`` loses only steps after the rank's latest checkpoint,
which a resume supersedes.

A process's first pass writes its start record: fresh (step 0, or the file was empty), resumed (a
``ResumableLoader.load_state_dict`` came first, or the sampler's first pass here begins past the start: the
step after the one that ended at that position), or continued without the loader state restored (appended
to a certificate after its latest checkpoint, and marked so: the run then differs from one that restored it).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from stateful_sampler.certificate.format import (
    MAGIC,
    PADDING_BIT,
    ZERO_DIGEST,
    RankFile,
    meta_record,
    rank_files,
    rank_path,
    read_rank_file,
    step_size,
    write_step,
)
from stateful_sampler.certificate.run import last_checkpoint_step, own_steps, resume_step
from stateful_sampler.errors import CertificateError
from stateful_sampler.order.layout import EpochLayout
from stateful_sampler.records import PassRecords
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.state import IDENTITY_FIELDS

_BLOCK_BATCHES = 64  # batches whose records are computed in one NumPy call
_MIN_BLOCK = 4096
WRITE_STEPS = 16  # steps written at once (and at every state taken, a pass's end and exit)


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
        self._block: tuple[int, int, bytes] | None = None  # local start, stop, the keys' bytes
        self._per_batch = 1  # records per batch of the pass under way
        self._facts = (0, 0, 1, 0, 0, 0)  # the pass's epoch, rank, world size, segment start, length, local length
        self._consumed = 0  # batches of the pass under way counted
        self._pending: list[int] = []  # steps of the sampler's pass under way counted, not yet written (their counts)
        self._batched = False  # the order followed is a StatefulSampler: its steps are written a block at a time
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
        """Only says when an order the certificate cannot follow is the first to start a pass."""
        if self._sampler is None and not _followable(order):
            self._warn_once(order)

    def batch(self, loader: Any, batch: Any, consumed: int) -> None:
        """One step of a ``ResumableLoader``, the ``consumed``-th of its pass."""
        order = loader.sampler
        if order is self._sampler and self._batched and self._layout is not None and order.pass_layout is self._layout:
            self._later(consumed)  # the usual step: counted now, written with the block it ends
        elif order is self._sampler or (self._sampler is None and _followable(order)):
            if isinstance(order, StatefulSampler):
                self._step(order, consumed, loader)
            else:
                self._stream_step(order, consumed, loader)

    def trained(self, order: Any) -> None:
        """One step of ``order``'s pass (a ``StatefulSampler`` or a ``ShardedStream``) that a loop without a
        ``ResumableLoader`` (Lightning's) trained on: its count in the pass is this writer's own."""
        if order is not self._sampler and self._sampler is not None:
            return
        if isinstance(order, StatefulSampler):
            self._step(order, self._consumed + 1 if order.pass_layout is self._layout else 1, order)
        elif _followable(order):
            same_pass = self._stream_pass == (order.epoch, order.position)
            self._stream_step(order, self._consumed + 1 if same_pass else 1, order)

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
        self._file.write(meta_record(entry))

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

    def _later(self, consumed: int) -> None:
        """Count a step of the sampler's pass under way; write the counted ones once there are a block of them.
        Written one at a time, between batches whose work has evicted the writer from the CPU's caches, a
        step costs about 5 times more than in a block."""
        pending = self._pending
        pending.append(consumed)
        self._consumed = consumed
        if len(pending) >= WRITE_STEPS or consumed * self._per_batch >= self._facts[5]:  # a block, or the pass's end
            self._flush()

    def _flush(self) -> None:
        """Write the steps counted and not yet written: packed into one block, the chain carried along, in one
        loop (a call less a step is a noticeable share of a step's cost)."""
        pending = self._pending
        if not pending:
            return
        layout, (epoch, rank, world_size, segment_start, length, local_length) = self._layout, self._facts
        per_batch, capacity = self._per_batch, self._capacity
        size = step_size(capacity)
        block = bytearray(size * len(pending))
        digest, step, after = self._digest, self._next_step, 0
        for offset, consumed in zip(range(0, len(block), size), pending):
            start = (consumed - 1) * per_batch
            stop = min(start + per_batch, local_length)
            keys = self._keys(layout, rank, start, stop)  # type: ignore[arg-type]
            # layout.position_after(rank, count), inlined: the step's global positions before and after it
            before = length if start >= local_length and start > 0 else segment_start + start * world_size
            after = length if stop >= local_length and stop > 0 else segment_start + stop * world_size
            digest = write_step(block, offset, digest, step, epoch, before, after, keys, after == length, capacity)
            step += 1
        self._digest, self._next_step, self._position = digest, step, (epoch, after)
        pending.clear()
        self._file.write(block)  # type: ignore[union-attr]

    def _stream_step(self, stream: Any, consumed: int, loader: Any) -> None:
        """One step of a ``ShardedStream``'s pass: a pass is told apart by its epoch and origin, or by its count
        starting again."""
        if not stream.pass_begun:
            return
        identity = (stream.epoch, stream.position)
        if identity != self._stream_pass or consumed <= self._consumed:
            self._stream_pass = identity
            self._pass_began(stream, stream.layout(), loader.batch_size)
        epoch, _, world_size, origin, size, local_length = self._facts
        start = (consumed - 1) * self._per_batch
        stop = min(start + self._per_batch, local_length)
        keys = self._keys(self._layout, stream.rank, start, stop)  # type: ignore[arg-type]
        before = size if start >= local_length else origin + start * world_size  # StreamLayout.position_after
        after = size if stop >= local_length else origin + stop * world_size
        block = bytearray(step_size(self._capacity))
        self._pack(block, 0, keys, epoch, before, after, after == size, consumed)
        self._file.write(block)  # type: ignore[union-attr]

    def _pack(self, block: bytearray, offset: int, keys: bytes, epoch: int, before: int, after: int, last: bool,
              consumed: int) -> None:  # fmt: skip
        """The next step's record into ``block`` at ``offset``, chained on."""
        step, capacity = self._next_step, self._capacity
        self._digest = write_step(block, offset, self._digest, step, epoch, before, after, keys, last, capacity)
        self._next_step, self._consumed, self._position = step + 1, consumed, (epoch, after)

    def _pass_began(self, order: Any, layout: Any, batch_size: int | None) -> None:
        """The first step of a pass: take its layout, and write the process's start record if it is due."""
        if self._sampler is None:
            self._follow(order)
        self._layout, self._block, self._per_batch, rank = layout, None, batch_size or 1, order.rank
        if isinstance(layout, EpochLayout):
            self._facts = (layout.epoch, rank, layout.world_size, layout.segment_start, layout.length,
                           layout.local_length(rank))  # fmt: skip
        else:  # a stream's StreamLayout: one epoch's deal from its origin, the same on every rank
            self._facts = (order.epoch, rank, layout.world_size, layout.origin, layout.size, layout.local_length)
        if self._file is None or self._pending_resume is not None:
            self._start(order)

    def _follow(self, order: Any) -> None:
        if not _followable(order):
            raise TypeError(f"a certificate follows a StatefulSampler or a ShardedStream, got {type(order).__name__}")
        self._sampler = order
        self._batched = isinstance(order, StatefulSampler)
        if self._batched:
            self._records = PassRecords(order.strategy, order.order, order.seed, order.size)

    def _keys(self, layout: EpochLayout, rank: int, start: int, stop: int) -> bytes:
        """The bytes of this rank's records at its local positions [start, stop) of the pass, padding marked:
        from the block the sampler drew when it still holds it, else from the order's arithmetic, a block of
        batches at a time."""
        block = self._block
        if (block is None or not block[0] <= start <= stop <= block[1]) and not isinstance(layout, EpochLayout):
            block_stop = min(max(stop, start + _MIN_BLOCK), self._facts[5])
            epoch, origin = self._stream_pass
            indices, padding = self._sampler.global_records(epoch, origin, start, block_stop)  # type: ignore[union-attr]
            records = indices.astype(np.uint64)
            records[padding] |= PADDING_BIT
            block = self._block = (start, block_stop, records.tobytes())
        elif block is None or not block[0] <= start <= stop <= block[1]:
            drawn = self._sampler.drawn_records(layout, start)  # type: ignore[union-attr]
            if drawn is not None and stop <= drawn[0] + drawn[1].size:
                block_start, records = drawn[0], drawn[1].astype(np.uint64)
            else:
                block_start = start
                block_stop = min(max(stop, start + max(_BLOCK_BATCHES * (stop - start), _MIN_BLOCK)),
                                 layout.local_length(rank))  # fmt: skip
                positions = layout.global_positions(rank, start, block_stop)
                records = self._records(layout.epoch, layout.pass_offsets(positions)).astype(np.uint64)  # type: ignore[misc]
            positions = layout.global_positions(rank, block_start, block_start + records.size)
            offsets = layout.pass_offsets(positions)
            padding = layout.is_padding(positions) | self._records.repeats(layout.epoch, offsets)  # type: ignore[union-attr]
            records[padding] |= PADDING_BIT
            block = self._block = (block_start, block_start + records.size, records.tobytes())
        return block[2][8 * (start - block[0]) : 8 * (stop - block[0])]

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
        previous = own_steps(own).get(first - 1) if own is not None else None
        if self._next_step > 0 and first == self._next_step:
            chain_from = self._digest  # a load later in this process, at the step it was at
        else:
            chain_from = previous.digest if previous is not None else ZERO_DIGEST
        self._capacity = order.batch_size or self._per_batch
        state = order.state_after(0)
        start = {
            "kind": "start",
            "time_ns": time.time_ns(),
            "rank": rank,
            "world_size": world_size,
            "batch_size": order.batch_size,
            "start_step": first,
            "restored": resumed is not None,
            "continued": resumed is None and own is not None and bool(own.segments),
            "resumed_from": None if resumed is None else {"epoch": resumed["epoch"], "position": resumed["position"]},
            "resume_found": found,
            "identity": {"seed": order.seed, **{name: state[name] for name in IDENTITY_FIELDS if name in state}},
            "chain_from": chain_from.hex(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        self._file.write(meta_record(start))
        self._next_step, self._digest = first, chain_from
        if not found:
            print(
                f"stateful-sampler certificate: the state loaded (epoch {resumed['epoch']}, position "  # type: ignore[index]
                f"{resumed['position']}) ends no step of {self.prefix}; compare will refuse it",  # type: ignore[index]
                file=sys.stderr,
            )

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

    def write(self, data: bytes | bytearray) -> None:
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
