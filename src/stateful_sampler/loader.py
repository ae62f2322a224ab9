"""``ResumableLoader``: the position a training loop has *consumed*, as a ``Stateful`` any framework saves.

DataLoader workers (and Accelerate's one-batch lookahead) draw indices ahead of training, so the
sampler's own drawn position is ahead of what the model saw. Counting the batches handed to the
loop and saving ``sampler.state_dict(consumed_batches=k)`` is exact whatever prefetched; exposing it
as ``state_dict`` / ``load_state_dict`` lets ``fabric.save``, ``torch.distributed.checkpoint`` and
``accelerator.save_state`` carry it without code of their own.

The position is the same on every rank of a run in step (the sampler's position is a global one). The RNG
states saved with it are each process's own, kept by rank: ``state_dict(every_rank=True)``, a collective,
gives rank 0's copy every rank's, so one file written by rank 0 resumes every rank exactly (Fabric's
plug-in takes it so); at another world size the position alone is restored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from stateful_sampler.checks import check_bool, check_optional_int
from stateful_sampler.errors import (
    BatchSizeError,
    DoubleShardingError,
    IncompatibleStateError,
    SamplerNotFoundError,
    StalePassError,
)
from stateful_sampler.hooks import (
    BatchHook,  # noqa: F401 - re-exported, the registry lives in hooks
    StateHook,  # noqa: F401 - re-exported, the registry lives in hooks
    add_batch_hook,  # noqa: F401 - re-exported, the registry lives in hooks
    add_state_hook,  # noqa: F401 - re-exported, the registry lives in hooks
    batch_handed_out,
    set_consumed_source,
    state_loaded,
    state_taken,
)
from stateful_sampler.plugins import install
from stateful_sampler.resumable import ResumableOrder, loader_batches
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.seeding.snapshot import capture_rank_rng_states, check_rank_rng_states, rank_rng_restorer
from stateful_sampler.wrappers import (
    adopt_batch_size,
    batch_size_on,
    dataloaders_under,
    innermost_dataloader,
    path_to_order,
)

# 2 added ``rng_states``: the process's RNG states at the save (``None`` when not captured), kept apart from
# the sampler's few hundred bytes. 3 keeps them by rank (``capture_rank_rng_states``). Version 1 (release
# 0.1.0) and 2 (0.2.0) states still load.
LOADER_STATE_VERSION = 3
_READABLE_LOADER_VERSIONS = (1, 2, 3)
_LOADER_FIELDS = {
    1: {"version", "sampler"},
    2: {"version", "sampler", "rng_states"},
    3: {"version", "sampler", "rng_states"},
}
_FABRIC_0_2_RANKS = "every_rank"  # release 0.2.0's Fabric plug-in: {"every_rank": [rank 0's, rank 1's, ...]}
_SAMPLER_STATE_MARKERS = ("size", "seed", "epoch", "position")


@dataclass(frozen=True)
class LoaderState:
    """What ``ResumableLoader.state_dict`` saves: the sampler's state at the consumed position, and the
    processes' RNG states by rank (``seeding.snapshot.capture_rank_rng_states``) when the loader captures them."""

    version: int
    sampler: dict[str, Any]
    rng_states: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "sampler": dict(self.sampler), "rng_states": self.rng_states}

    @classmethod
    def from_dict(cls, data: Any) -> LoaderState:
        if not isinstance(data, Mapping):
            expected = "a dict from ResumableLoader.state_dict()"
            raise IncompatibleStateError("loader state", type(data).__name__, expected)
        if "sampler" not in data and all(name in data for name in _SAMPLER_STATE_MARKERS):
            raise IncompatibleStateError(
                "sampler",
                "<missing>",
                "a ResumableLoader state",
                "this is a sampler state: pass it to the sampler (loader.sampler.load_state_dict(state)), "
                "or save loader.state_dict() instead",
            )
        version = data.get("version", "<missing>")
        if type(version) is not int or version not in _READABLE_LOADER_VERSIONS:
            raise IncompatibleStateError("version", version, LOADER_STATE_VERSION, "unknown loader state version")
        for name in sorted(set(data) - _LOADER_FIELDS[version]):
            raise IncompatibleStateError(name, data[name], "<absent>", f"not a field of loader state version {version}")
        sampler = data.get("sampler", "<missing>")
        if not isinstance(sampler, Mapping):
            raise IncompatibleStateError("sampler", sampler, "a dict from StatefulSampler.state_dict()")
        rng_states = data.get("rng_states")
        if rng_states is None:
            return cls(LOADER_STATE_VERSION, dict(sampler))
        if version == 2:
            rng_states = _by_rank(rng_states, sampler)
        check_rank_rng_states(rng_states)
        return cls(LOADER_STATE_VERSION, dict(sampler), dict(rng_states))


def _by_rank(rng_states: Any, sampler: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.2.0 state's RNG states by rank: the Fabric plug-in's list, or one process's snapshot, which names
    no rank: it is rank 0's when the run had one rank, and at more the data alone resumes (with a warning)."""
    if not isinstance(rng_states, Mapping):
        raise IncompatibleStateError("rng_states", type(rng_states).__name__, "None or a capture_rng_states() dict")
    if set(rng_states) == {_FABRIC_0_2_RANKS} and isinstance(rng_states[_FABRIC_0_2_RANKS], list):
        every = rng_states[_FABRIC_0_2_RANKS]
        return {"world_size": max(len(every), 1), "ranks": {str(rank): states for rank, states in enumerate(every)}}
    world_size = sampler.get("world_size")
    if type(world_size) is not int or world_size < 1:
        raise IncompatibleStateError("sampler.world_size", world_size, "an int of at least 1")
    return {"world_size": world_size, "ranks": {"0": dict(rng_states)} if world_size == 1 else {}}


@dataclass
class _LoaderPass:
    """One pass of the loader over the rest of an epoch: what it yields and how much of it the loop took."""

    epoch: int
    count: Callable[[], int]  # the batches this pass yields (capped by batches_per_epoch), counted when first asked
    consumed: int = 0  # batches handed to the loop
    started: bool = False  # the first next() has run: epoch and position are read then
    counted: int | None = None

    @property
    def batches(self) -> int:
        if self.counted is None:
            self.counted = self.count()
        return self.counted

    def recount(self, epoch: int, count: Callable[[], int]) -> None:
        """The pass, not yet started, begins at another epoch or position: counted again from there."""
        self.epoch, self.count, self.counted = epoch, count, None


class ResumableLoader:
    """Iterates ``loader`` and saves the position the loop consumed; ``loader`` may be a framework's wrapper.

    Args:
        loader: a ``DataLoader`` (or Fabric's / Accelerate's wrapper of one) whose sampler is a
            ``StatefulSampler``, directly or inside its batch sampler. The batch size is the
            ``DataLoader``'s (or the sampler's, when only it has one; both: they must agree).
            ``DataLoader(batch_size=None)`` yields records one by one: they are counted as such.
        epoch_sync: called with the sampler's epoch before each pass, for wrappers that set the
            sampler's epoch themselves from a count of their own passes (Fabric, Accelerate): a
            resumed process starts that count at 0, which would rewind the restored epoch.
        batches_per_epoch: cap each epoch at this many batches (per rank), as Lightning's
            ``limit_train_batches`` does: a pass stops there and the epoch counts as ended (the next
            pass is the next epoch), so a state saved anywhere resumes exactly. ``None``: whole epochs.
        rng_states: save the process's RNG states (torch CPU and CUDA, NumPy, ``random``) with the data,
            under its rank, and restore each rank's own on load, so that dropout resumes bitwise (default
            ``True``). For one file written by rank 0, take the state with ``state_dict(every_rank=True)``
            on every rank. At another world size the RNGs are not restored (a warning says so). Under a
            framework that restores RNGs itself (Accelerate), pass ``False``.

    Iteration (docs/core.md, "Epoch ends and early exits"): each ``iter()`` is a pass over the rest
    of the current epoch, continuing from what the loop consumed; ``set_epoch`` and ``iter()`` start a
    clean count, and an older iterator advanced after a newer one exists raises ``StalePassError``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = ResumableLoader(DataLoader(range(10), sampler=StatefulSampler(10), batch_size=4))
        >>> first = next(iter(loader))
        >>> state = loader.state_dict()                # after 1 consumed batch, whatever workers prefetched
        >>> resumed = ResumableLoader(DataLoader(range(10), sampler=StatefulSampler(10), batch_size=4))
        >>> resumed.load_state_dict(state)
        >>> len(resumed)                               # the batches left in the epoch
        2
        >>> rest = [batch.tolist() for batch in resumed]
        >>> rest == [batch.tolist() for batch in loader]   # the live loader's next pass continues the same way
        True
        >>> len(first) + sum(len(batch) for batch in rest)
        10
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        epoch_sync: Callable[[int], None] | None = None,
        batches_per_epoch: int | None = None,
        rng_states: bool = True,
    ) -> None:
        self.loader = loader
        self.sampler: ResumableOrder = find_sampler(loader)  # driven through the seam's public members only
        self._records_per_batch = _records_per_batch(loader, self.sampler)
        self._drop_last = _drops_last(loader)
        self.batches_per_epoch = check_optional_int("batches_per_epoch", batches_per_epoch, minimum=1)
        self.rng_states = check_bool("rng_states", rng_states)
        self._epoch_sync = epoch_sync
        self._pass: _LoaderPass | None = None  # the pass begun by the latest iter(), until it ends or is replaced
        self._token: object | None = None  # the latest iterator's; an older one is stale
        self._generators = _own_generators(loader)
        set_consumed_source(self.sampler, self._consumed_positions)
        install()  # tools that observe training from outside (verify) install their hooks

    # -- what the DataLoader holds, taken rather than asked for again

    @property
    def dataset(self) -> Any:
        """The dataset of the ``DataLoader`` iterated (through any framework wrapper)."""
        inner = innermost_dataloader(self.loader)
        return getattr(inner if inner is not None else self.loader, "dataset", None)

    @property
    def batch_size(self) -> int | None:
        """Records per batch on this rank; ``None`` when the loader yields records one by one."""
        return self._records_per_batch if _batches(self.loader) else None

    @property
    def drop_last(self) -> bool:
        """Whether the ``DataLoader`` drops each pass's last, partial batch."""
        return self._drop_last

    @property
    def num_workers(self) -> int:
        """The ``DataLoader``'s worker processes (0 when the loader is none)."""
        inner = innermost_dataloader(self.loader)
        return int(getattr(inner, "num_workers", 0) or 0)

    @property
    def epoch(self) -> int:
        """The epoch of the pass begun (until it ends, ``set_epoch`` or a resume), else the one the next
        pass draws. The sampler's own epoch moves on as soon as workers have drawn the pass to its end,
        before the loop has its last batches."""
        return self._pass.epoch if self._pass is not None else self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start with a clean count; the current epoch keeps the consumed position
        (as ``StatefulSampler.set_epoch``, which Lightning calls again on resume)."""
        pending = self._pass if self._pass is not None and not self._pass.started else None
        if pending is None:
            self._settle()
        self.sampler.set_epoch(epoch)
        if pending is not None:  # an iterator not yet started reads the epoch at its first batch, as the sampler does
            pending.recount(self.sampler.epoch, self._pass_batches())

    def __len__(self) -> int:
        """The batches left in the pass under way, else in the next pass: the rest of the epoch from
        the consumed position (after a mid-epoch resume, what remains), capped by ``batches_per_epoch``.
        Read at a pass's start it is the pass's batch count (tqdm, per-epoch step arithmetic); a
        restored loader says the same as the live one at every point."""
        if self._pass is not None:
            return max(0, self._pass.batches - self._pass.consumed)
        return self._next_pass_batches()

    def _next_pass_batches(self) -> int:
        batches = self._batches_of(self.sampler.remaining_length())
        if self.batches_per_epoch is None:
            return batches
        return max(0, min(batches, self.batches_per_epoch - self._batches_before()))

    def _batches_of(self, records: int) -> int:
        size = self._records_per_batch
        return records // size if self._drop_last else -(-records // size)

    def _pass_batches(self) -> Callable[[], int]:
        """The next pass's batch count as a function: counted now, or, where the order counts its remaining
        length later (``StatefulSampler.remaining_length_later``: packed rows whose epoch is still being counted)
        and no cap needs it at the start, when first asked (``len()``), so the first batches need not wait."""
        later = getattr(self.sampler, "remaining_length_later", None)
        records = later() if later is not None and self.batches_per_epoch is None else None
        if records is None:
            return partial(int, self._next_pass_batches())
        return partial(_batches_later, self._batches_of, records)

    def _batches_before(self) -> int:
        """This rank's batches of the current epoch consumed before the next pass (a resume's)."""
        # the layout's local_before(rank), for a stream too; __len__ is not len(): it may pass sys.maxsize
        before = self.sampler.__len__() - self.sampler.remaining_length()
        return -(-before // self._records_per_batch)

    # -- iteration

    def __iter__(self) -> Iterator[Any]:
        """A pass over the rest of the epoch; the previous pass is settled at once (not at the first
        batch), so a state taken between ``iter()`` and the first batch describes this pass."""
        self._settle()
        token = self._token = object()
        self._pass = _LoaderPass(self.sampler.epoch, self._pass_batches())
        return self._run(token, self._pass)

    def _run(self, token: object, current: _LoaderPass) -> Iterator[Any]:
        self._check_current(token)
        current.started = True
        if self._epoch_sync is not None:
            self._epoch_sync(self.sampler.epoch)
        current.recount(self.sampler.epoch, self._pass_batches())
        for generator in self._generators:
            generator.manual_seed((self.sampler.seed * 1_000_003 + current.epoch) % (1 << 63))
        if self.batches_per_epoch is not None and current.batches == 0:
            self._end_capped_epoch(token, current)
            return
        batches = iter(loader_batches(self.sampler, self.loader))
        while self.batches_per_epoch is None or current.consumed < current.batches:
            try:
                batch = next(batches)
            except StopIteration:
                break
            self._check_current(token)
            current.consumed += 1
            batch_handed_out(self, batch, current.consumed)
            yield batch
            self._check_current(token)
        else:
            self._end_capped_epoch(token, current)
            return
        if self._token is token:  # the pass ended: the sampler's drawn position is the consumed one
            self._pass = self._token = None

    def _end_capped_epoch(self, token: object, current: _LoaderPass) -> None:
        """The cap is reached: the epoch ends here, as if the loop had seen its end."""
        if self._token is token:
            self._pass = self._token = None
            self.sampler.set_epoch(current.epoch + 1)

    def _check_current(self, token: object) -> None:
        if self._token is not token:
            raise StalePassError(
                "this ResumableLoader iterator was replaced by a newer iter(loader) or loader.set_epoch(): "
                "iterate one pass at a time (its batches would count against the new pass)"
            )

    def _settle(self) -> None:
        """End the pass begun, leaving the sampler at what the loop consumed, so the next pass
        continues from there (a loop that broke off resumes where it stopped)."""
        current, self._pass, self._token = self._pass, None, None
        if current is None:
            self.sampler.settle()  # a pass that ended is done with: the next one starts at the cursor
            return
        if current.epoch == self.sampler.epoch or self.sampler.pass_begun:
            self.sampler.load_state_dict(self._sampler_state(current))

    def _consumed_positions(self) -> int | None:
        """This rank's positions of the sampler's pass that the loop consumed (the seam
        ``sampler.state_dict()`` reads); ``None`` when no pass of this loader is under way."""
        if self._pass is None or not self._pass.started:
            return None
        return self._pass.consumed * self._records_per_batch

    def _sampler_state(self, current: _LoaderPass) -> dict[str, Any]:
        return self.sampler.state_after(current.consumed * self._records_per_batch)

    # -- state

    def state_dict(self, *, every_rank: bool = False) -> dict[str, Any]:
        """The state after the batches the loop consumed, with this process's RNG states (``rng_states``).

        ``every_rank=True`` gathers every rank's RNG states into rank 0's state, the one file that resumes
        every rank exactly: a collective, so call it on every rank, then let rank 0 save it. Without it,
        nothing is exchanged (a call on rank 0 alone never waits), and the state holds this rank's only.

        Example::

            state = loader.state_dict(every_rank=True)   # on every rank
            if rank == 0:
                torch.save({"model": model.state_dict(), "loader": state}, path)
        """
        current = self._pass
        sampler_state = self.sampler.state_dict() if current is None else self._sampler_state(current)
        state_taken(self, current.consumed if current is not None else 0)
        rng = capture_rank_rng_states(every_rank=check_bool("every_rank", every_rank)) if self.rng_states else None
        return LoaderState(LOADER_STATE_VERSION, sampler_state, rng).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state in O(1); the next pass starts at the saved consumed position.
        This rank's RNG states saved with it are restored too (unless ``rng_states=False``), at the world
        size they were saved at: load it last, just before the loop, after the model is built. Everything
        is checked before anything changes."""
        saved = LoaderState.from_dict(state)
        restore_rngs = rank_rng_restorer(saved.rng_states) if saved.rng_states is not None and self.rng_states else None
        pending = self._pass if self._pass is not None and not self._pass.started else None
        self.sampler.load_state_dict(saved.sampler)
        if pending is None:
            self._pass = self._token = None
        else:  # an iterator made before the load and not yet started begins at the loaded position
            pending.recount(self.sampler.epoch, self._pass_batches())
        if restore_rngs is not None:
            restore_rngs()
        state_loaded(self, saved.sampler)


def _batches_later(batches_of: Callable[[int], int], records: Callable[[], int]) -> int:
    return batches_of(records())


def _records_per_batch(loader: Any, sampler: ResumableOrder) -> int:
    """Records per item the loop receives: the batch size, 1 for ``DataLoader(batch_size=None)``."""
    if not _batches(loader):
        return 1
    return sampler.batch_size or 1


def _batches(loader: Any) -> bool:
    """Whether the ``DataLoader`` iterated batches its records (``batch_size=None`` yields them one by one)."""
    inner = innermost_dataloader(loader)
    if inner is None:
        return True
    return inner.batch_size is not None or inner.batch_sampler is not None


def _drops_last(loader: Any) -> bool:
    inner = innermost_dataloader(loader)
    return bool(inner is not None and inner.drop_last and inner.batch_size is not None)


def find_sampler(loader: Any) -> StatefulSampler:
    """The ``StatefulSampler`` inside ``loader``, through the wrappers frameworks put around loaders.

    The batch size is asked once: a sampler without ``batch_size`` takes the loader's (the innermost
    batch size on the way to the sampler), and only a contradiction is refused, naming both values.
    Refuses a loader without a sampler, a loader that batches with neither batch size known, and a
    wrapper that shards the sampler's already sharded output again.
    """
    path = path_to_order(loader)
    if path is None:
        inner = getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None)
        raise SamplerNotFoundError(
            f"ResumableLoader needs a StatefulSampler at loader.sampler or loader.batch_sampler.sampler, found none in "
            f"{type(loader).__name__} (sampler: {type(inner).__name__}): build the loader as "
            f"DataLoader(dataset, sampler=StatefulSampler(dataset), batch_size=B)"
        )
    sampler = path[-1]
    adopt_batch_size(sampler, batch_size_on(path))
    if sampler.batch_size is None and _batches(loader) and innermost_dataloader(loader) is None:
        raise BatchSizeError(
            f"ResumableLoader counts consumed batches, and neither {type(loader).__name__} nor its StatefulSampler "
            f"has a batch_size: pass StatefulSampler(..., batch_size=B)",
            loader_batch_size=None,
            order_batch_size=None,
        )
    for wrapper in path[:-1]:
        processes = getattr(wrapper, "num_processes", 1)
        if isinstance(processes, int) and processes > 1 and sampler.num_replicas > 1:
            raise DoubleShardingError(
                f"{type(wrapper).__name__} (num_processes={processes}) shards the batches of a StatefulSampler that "
                f"already shards over num_replicas={sampler.num_replicas}: each rank would see 1/{processes} of its "
                f"share; prepare the loader with stateful_sampler.accelerate.prepare_loader(accelerator, loader)"
            )
    return sampler


def _own_generators(loader: Any) -> list[torch.Generator]:
    """Give each ``DataLoader`` iterated under ``loader`` that has none a generator of its own, to be seeded per pass.

    A ``DataLoader`` draws its workers' base seed from torch's global RNG each time a pass starts, so
    a pass a resume starts mid-epoch would shift training's random stream (dropout) by a draw the
    uninterrupted run took at the epoch's start. With its own generator, seeded from (seed, epoch),
    the global stream is untouched and a resumed pass's workers get the base seed of the epoch.
    """
    generators = []
    for found in dataloaders_under(loader):
        if found.generator is None:
            found.generator = torch.Generator()
            generators.append(found.generator)
    return generators
