"""``SamplerCheckpoint``: save the train samplers' consumed position, and resume from it exactly.

Lightning reads a callback's state before the train loader exists, and starts iterating the
loader before it calls ``set_epoch`` on the resumed epoch. So the saved states wait here until
the first pass of a train sampler starts (``add_pass_start_hook``) or, with no workers, until
``on_train_start``, whichever comes first. The position saved is what the training loop has
*processed*, counted from Lightning's batch progress, never what workers prefetched.

With ``restore_rng_states`` (the default) the checkpoint also holds each rank's process RNG states
(torch CPU and CUDA, NumPy, ``random``), which Lightning's own checkpoint does not: a model that
draws from them (``nn.Dropout``) resumes bitwise, not only its data. They are put back at
``on_train_start``, after the resumed fit's set-up has drawn from them (the loader's ``iter()``).

The callback's state outlives the fit: ``OnExceptionCheckpoint`` saves after every callback's
``on_exception``, and ``trainer.save_checkpoint`` may run after ``fit`` returned, so the position
where the fit stopped is kept until the next fit starts.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, cast

import torch.distributed as dist

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.hooks import TrainerObserver, add_pass_start_hook
from stateful_sampler.lightning.epoch_length import (
    EpochBatches,
    count_epoch,
    hold_epoch_batches,
    lightning_epoch_batches,
)
from stateful_sampler.lightning.framework import framework_of
from stateful_sampler.lightning.loaders import (
    SamplerSetupError,
    checked_train_samplers,
    keep_distributed_batch_samplers,
    restart_train_iteration,
    set_batch_sampler_epochs,
    superseded_loader_states,
    train_samplers,
)
from stateful_sampler.lightning.restart import (
    complete_saved_batch,
    drop_loader_states,
    mark_epoch_unfinished,
    start_next_epoch,
)
from stateful_sampler.plugins import trainer_observers
from stateful_sampler.ranks import process_world_size
from stateful_sampler.resumable import ResumableOrder
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.seeding.snapshot import capture_rng_states, restore_rng_states

if TYPE_CHECKING:  # either package's; see framework.py
    from lightning.pytorch import LightningModule, Trainer

    # private: Lightning's progress tracker type, for typing only
    from lightning.pytorch.loops.progress import _ProcessedTracker

CALLBACK_STATE_VERSION = 3
_READABLE_VERSIONS = (2, 3)  # version 2 holds no RNG states
# Lightning warns on every mid-epoch resume whose loader has no state_dict; with our state loaded
# the samplers carry the position, so the warning is wrong for this fit (and only for this fit).
_NOT_RESUMABLE_WARNING = r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"


@dataclass(frozen=True)
class _SavedPosition:
    """The callback's checkpoint entry: the epoch (as Lightning numbers it) and the batches processed
    in it, whether that ended the epoch for Lightning, the epoch's batch count as Lightning held it,
    one state per train sampler in loader order, which of Lightning's saved loader states these
    replace, and each rank's process RNG states (``None``: not saved)."""

    epoch: int
    batches_processed: int
    epoch_finished: bool
    epoch_batches: dict[str, Any]
    samplers: list[dict[str, Any]]
    superseded_loader_states: list[int]
    rng_states: list[dict[str, Any]] | None = None

    @property
    def mid_epoch(self) -> bool:
        return self.batches_processed > 0 and not self.epoch_finished

    def to_dict(self) -> dict[str, Any]:
        return {"version": CALLBACK_STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> _SavedPosition:
        version = state.get("version", "<missing>")
        if version not in _READABLE_VERSIONS:
            raise IncompatibleStateError("SamplerCheckpoint version", version, CALLBACK_STATE_VERSION)
        optional = {"rng_states"} if version == 2 else set()
        for field in fields(cls):
            if field.name not in state and field.name not in optional:
                raise IncompatibleStateError(f"SamplerCheckpoint {field.name}", "<missing>", field.type)
        return cls(**{field.name: state[field.name] for field in fields(cls) if field.name in state})


@dataclass(frozen=True)
class _PassStart:
    """Where a train sampler's current pass began, in Lightning's count and in the sampler's order.

    A sampler counts consumed batches from its pass start, Lightning from the epoch start. A pass
    begun from a restored state remembers that state: Lightning calls ``set_epoch`` on the resumed
    epoch after workers may have drawn the whole pass, which detaches the pass from the sampler.
    """

    batches_before: int
    epoch: int  # the epoch the pass draws
    restored_from: dict[str, Any] | None = None
    started: bool = True


class SamplerCheckpointHooks:
    """Makes a ``Trainer`` resume its train ``StatefulSampler`` s exactly where training stopped.

    Add it next to a step-based ``ModelCheckpoint`` and resume with ``ckpt_path``; each train
    ``DataLoader`` needs ``sampler=StatefulSampler(ds, batch_size=B)`` and ``batch_size=B``.
    Without a checkpoint to resume from, the run is exactly what it is without this callback.
    It keeps Lightning's per-epoch batch count equal to what the samplers yield (``epoch_length``)
    and, in a checkpoint it saved, replaces the train loaders' own saved positions (``restart``).

    Args:
        restore_rng_states: save each rank's process RNG states (torch CPU and CUDA, NumPy, ``random``)
            with the position and put them back on resume, so that a model drawing from them
            (``nn.Dropout``) resumes bitwise. Lightning does not save them. They are put back only
            at the world size they were saved at (at another one no uninterrupted run has the
            same per-rank randomness); ``False`` leaves the RNGs to the user's seeding.

    This is the implementation; the callback is ``stateful_sampler.lightning.SamplerCheckpoint`` for
    ``lightning.pytorch`` and ``stateful_sampler.pytorch_lightning.SamplerCheckpoint`` for the classic
    package: this class under each package's ``Callback``.

    Raises:
        SamplerSetupError: at ``on_train_start``, for a train loader it cannot resume exactly.
        IncompatibleStateError: for a checkpoint whose state does not fit the samplers.

    Example:
        >>> trainer = Trainer(callbacks=[SamplerCheckpoint(),  # doctest: +SKIP
        ...     ModelCheckpoint(every_n_train_steps=50, save_last=True, save_on_train_epoch_end=False)])
        >>> trainer.fit(model, datamodule, ckpt_path="last")  # doctest: +SKIP
    """

    state_key: str  # Lightning's Callback provides it

    def __init__(self, *, restore_rng_states: bool = True) -> None:
        self.restore_rng_states = restore_rng_states
        self._remove_hook: Callable[[], None] | None = None
        self._observers: list[TrainerObserver] | None = None  # plugins' (verify's, the certificate's), once set up
        self._warning_filter: tuple[Any, ...] | None = None
        self._forget_the_run()

    def _forget_the_run(self) -> None:
        self._trainer: Trainer | None = None
        self._pending: _SavedPosition | None = None
        self._resumed: _SavedPosition | None = None  # the restored position, once in the samplers
        self._loaded = False  # this fit resumed from a checkpoint that holds a state of ours
        self._restore_error: ValueError | None = None
        self._checked = False  # on_train_start found the train samplers fit to be counted
        self._passes: dict[ResumableOrder, _PassStart] = {}
        # After a checkpoint that ended an epoch, Lightning still counts the finished epoch's
        # batches while it restarts, and only then the next epoch's.
        self._recount_at_first_batch = False
        # A resumed epoch that had already run limit_train_batches: it ends with no batch.
        self._ended_at_start: _SavedPosition | None = None
        self._stopped: dict[str, Any] = {}  # where the last fit stopped, for a checkpoint saved later

    # -- lifecycle

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        keep_distributed_batch_samplers(trainer)  # before Lightning prepares any loader
        if stage == "fit" and self._remove_hook is None:
            self._forget_the_run()
            self._trainer = trainer
            self._remove_hook = add_pass_start_hook(self._on_pass_start)
        if self._observers is None:
            self._observers = trainer_observers()  # the plugins' observers of this fit (verify, the certificate)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop()
        for observer in self._observers or ():
            observer.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning calls no teardown after an exception, and OnExceptionCheckpoint saves after this.
        self._stop()

    def _stop(self) -> None:
        """Keep where the fit stopped, and let go of the samplers and the warning filter."""
        if self._remove_hook is None:
            return
        stopped = self._position()
        self._remove_hook()
        self._remove_hook = None
        if self._warning_filter in warnings.filters:
            cast("list[Any]", warnings.filters).remove(self._warning_filter)  # typeshed says Sequence; it is a list
        self._warning_filter = None
        self._forget_the_run()
        self._stopped = stopped

    # -- checkpoint

    def state_dict(self) -> dict[str, Any]:
        position = self._position() if self._remove_hook is not None else self._stopped
        return _with_every_rank_rng(position)

    def _position(self) -> dict[str, Any]:
        """The position the training loop has processed, or the one still waiting to be restored."""
        for saved in (self._pending, self._ended_at_start):
            if saved is not None:
                return saved.to_dict()
        trainer = self._trainer
        samplers = train_samplers(trainer) if trainer is not None and self._checked else []
        if trainer is None or not samplers:
            return {}
        processed = _batches_processed(trainer)
        states = []
        for sampler in samplers:
            start = self._passes.get(sampler, _PassStart(0, _lightning_epoch(trainer)))
            consumed = processed - start.batches_before
            if start.restored_from is None:
                states.append(sampler.state_dict(consumed_batches=consumed))
            else:
                states.append(_state_after(sampler, start.restored_from, consumed))
        # Lightning counts a fit that stopped mid-epoch (max_steps) as past the epoch; the pass knows better
        epoch = self._passes[samplers[0]].epoch if samplers[0] in self._passes else _lightning_epoch(trainer)
        finished = processed >= trainer.num_training_batches
        epoch_batches = asdict(lightning_epoch_batches(trainer))
        superseded = superseded_loader_states(trainer)
        position = _SavedPosition(epoch, processed, finished, epoch_batches, states, superseded).to_dict()
        if self.restore_rng_states:
            position[_OWN_RNG] = capture_rng_states()  # this rank's; state_dict() gathers every rank's
        return position

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Runs before Lightning restores its loops from ``checkpoint``: make them agree with our state."""
        if framework_of(trainer).restarts_from_completed:
            complete_saved_batch(checkpoint)
        entry = checkpoint.get("callbacks", {}).get(self.state_key)
        if not entry:
            return
        saved = _SavedPosition.from_dict(entry)
        if saved.mid_epoch:
            mark_epoch_unfinished(checkpoint, saved.epoch)
        elif saved.epoch_finished and not framework_of(trainer).restarts_from_completed:
            start_next_epoch(checkpoint, saved.epoch)
        drop_loader_states(checkpoint, saved.superseded_loader_states)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Runs before the train loader exists: keep the state for the samplers' first pass."""
        self._pending = _SavedPosition.from_dict(state_dict)
        self._loaded = True
        if self._warning_filter is None and self._trainer is not None:
            category = framework_of(self._trainer).possible_user_warning
            warnings.filterwarnings("ignore", message=_NOT_RESUMABLE_WARNING, category=category)
            self._warning_filter = warnings.filters[0]

    # -- restoring, at the first of: a train sampler's pass start, on_train_start

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        samplers = checked_train_samplers(trainer)
        if self._restore_error is not None:
            raise self._restore_error
        self._checked = True
        if self._pending is not None:
            begun = any(sampler in self._passes for sampler in samplers)
            self._restore(samplers, self._pending)
            if begun:
                # A strategy that restores after setup read the checkpoint only after
                # estimated_stepping_batches had started the loader's workers (#20550).
                restart_train_iteration(trainer)
        elif trainer.ckpt_path is not None and not self._loaded:
            self._resume_without_state(trainer, samplers)
        self._restore_rng_states(trainer)
        self._count_first_epoch(trainer)

    def _restore_rng_states(self, trainer: Trainer) -> None:
        """Put this rank's saved RNG states back, now that the fit's set-up has drawn from them."""
        resumed = self._resumed
        if not self.restore_rng_states or resumed is None or not resumed.rng_states:
            return
        if len(resumed.rng_states) != trainer.world_size:
            return  # another world size: no uninterrupted run has these ranks' randomness
        restore_rng_states(resumed.rng_states[trainer.global_rank])
        if resumed.epoch_finished:
            # The uninterrupted fit starts the next epoch's pass after the save, and the loader's
            # iter() draws its workers' base seed from torch's RNG; the resumed fit's pass began
            # before the restore. Begin it again, so that it draws what the uninterrupted one did.
            # The pass begun again is the restored one, from the restored state (a stream would move on
            # past a pass left early), counted from the epoch's start: Lightning still counts the
            # finished epoch's batches here.
            for sampler, start in list(self._passes.items()):
                if start.restored_from is not None:
                    sampler.load_state_dict(start.restored_from)
                self._passes[sampler] = replace(start, started=False)
            restart_train_iteration(trainer)

    def _count_first_epoch(self, trainer: Trainer) -> None:
        resumed = self._resumed
        if resumed is not None and resumed.epoch_finished:
            # Lightning decides that the saved epoch is over from its batch count, after this hook
            hold_epoch_batches(trainer, EpochBatches(**resumed.epoch_batches).limits, _fetched(trainer))
            self._recount_at_first_batch = True
            return
        before = resumed.batches_processed if resumed is not None else 0
        if count_epoch(trainer, before, before + _fetched(trainer)) and resumed is not None and before > 0:
            finished = replace(resumed, epoch_finished=True, epoch_batches=asdict(lightning_epoch_batches(trainer)))
            self._ended_at_start = finished

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.fit_loop.restarting and framework_of(trainer).restarts_from_completed:
            return  # Lightning < 2.5 calls this for the resumed epoch too: on_train_start counted it
        self._ended_at_start = None
        set_batch_sampler_epochs(trainer, _lightning_epoch(trainer))  # Lightning has set the others' epochs
        count_epoch(trainer, 0, _fetched(trainer))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._recount_at_first_batch:
            self._recount_at_first_batch = False
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = count_epoch(trainer, 0, _fetched(trainer))
        for observer in self._observers or ():
            observer.batch(trainer, batch, batch_idx)

    # -- what the plugins observe: `stateful-sampler verify -- COMMAND`'s recording, the certificate

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        for observer in self._observers or ():
            observer.checkpoint(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for observer in self._observers or ():
            observer.train_end(trainer, pl_module)

    def _on_pass_start(self, sampler: ResumableOrder) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        samplers = train_samplers(trainer)
        if not any(sampler is train_sampler for train_sampler in samplers):
            return  # a validation or test loader's sampler: not ours to move
        if self._pending is not None:
            try:
                self._restore(samplers, self._pending)
            except ValueError as error:
                # Raised from on_train_start instead: Lightning's clean-up after an error inside
                # iter(loader) fails in turn and buries it under an unrelated RuntimeError.
                self._pending, self._restore_error = None, error
        start = self._passes.get(sampler)
        if start is not None and not start.started:
            self._passes[sampler] = replace(start, started=True)
        else:
            # Lightning's set_epoch may come after this pass has begun (#21938), e.g. for a sampler
            # that a previous fit left in a later epoch.
            sampler.set_epoch(_lightning_epoch(trainer))
            self._passes[sampler] = _PassStart(_batches_before_pass(trainer), _lightning_epoch(trainer))

    def _resume_without_state(self, trainer: Trainer, samplers: list[StatefulSampler]) -> None:
        """A checkpoint saved without this callback resumes exactly only at an epoch's end, where the
        samplers start a new epoch; a pass begun before Lightning restored its epoch (#20550) begins
        again, in the right one."""
        if _mid_epoch(trainer):
            raise SamplerSetupError(
                f"checkpoint {trainer.ckpt_path} was saved mid-epoch without SamplerCheckpoint, so where the "
                f"epoch stopped is unknown: resume from an end-of-epoch checkpoint, or from one saved with "
                f"SamplerCheckpoint in the Trainer's callbacks"
            )
        epoch = _lightning_epoch(trainer)
        if any(sampler in self._passes and self._passes[sampler].epoch != epoch for sampler in samplers):
            for sampler in samplers:
                sampler.set_epoch(epoch)
            restart_train_iteration(trainer)

    def _restore(self, samplers: list[StatefulSampler], saved: _SavedPosition) -> None:
        """Load the saved states; after a checkpoint that ended Lightning's epoch, every sampler moves
        on to the next epoch (a shorter loader under ``min_size`` never drew its epoch to the end)."""
        if len(saved.samplers) != len(samplers):
            raise IncompatibleStateError(
                "SamplerCheckpoint samplers",
                len(saved.samplers),
                len(samplers),
                "the checkpoint holds one state per StatefulSampler of the train loaders",
            )
        batches_before = 0 if saved.epoch_finished else saved.batches_processed
        for sampler, state in zip(samplers, saved.samplers):
            sampler.load_state_dict(state)
            if saved.epoch_finished:
                sampler.set_epoch(sampler.epoch + 1)
            self._passes[sampler] = _PassStart(batches_before, sampler.epoch, sampler.state_dict(), started=False)
        self._pending, self._resumed = None, saved


_OWN_RNG = "_own_rng_states"  # a position's RNG states of this rank only, until state_dict() gathers them


def _with_every_rank_rng(position: dict[str, Any]) -> dict[str, Any]:
    """``position`` with this rank's RNG states replaced by every rank's, in rank order (a collective
    under DDP: Lightning asks every rank for callback states at each save, and rank 0 writes them)."""
    if _OWN_RNG not in position:
        return position
    position = dict(position)
    own = position.pop(_OWN_RNG)
    if process_world_size() > 1:
        every: list[Any] = [None] * process_world_size()
        dist.all_gather_object(every, own)
    else:
        every = [own]
    position["rng_states"] = every
    return position


def _state_after(sampler: StatefulSampler, origin: dict[str, Any], consumed_batches: int) -> dict[str, Any]:
    """The state ``consumed_batches`` after ``origin``, computed by the sampler's own arithmetic on a
    copy, so the running sampler and its pass stay untouched."""
    probe = copy.copy(sampler)
    probe.load_state_dict(origin)
    return probe.state_dict(consumed_batches=consumed_batches)


def _batches_processed(trainer: Trainer) -> int:
    """Batches the training loop has finished in the current epoch (a resumed run counts on)."""
    # Lightning types ``current`` as _ReadyCompletedTracker; its default, kept by the fit loop, is a _ProcessedTracker
    return cast("_ProcessedTracker", trainer.fit_loop.epoch_loop.batch_progress.current).processed


def _batches_before_pass(trainer: Trainer) -> int:
    """Batches processed in the epoch a pass begun now draws. After an epoch's last batch that is the
    next epoch, from its start: Lightning keeps the finished epoch's count until its epoch loop resets
    it, and a fit resumed from there begins its passes again before that (``on_train_start``)."""
    batch_progress = trainer.fit_loop.epoch_loop.batch_progress
    return 0 if batch_progress.is_last_batch else _batches_processed(trainer)


def _lightning_epoch(trainer: Trainer) -> int:
    """The epoch Lightning passes to ``set_epoch`` (``trainer.current_epoch`` lags behind it at an
    epoch's end)."""
    return cast("_ProcessedTracker", trainer.fit_loop.epoch_progress.current).processed


def _mid_epoch(trainer: Trainer) -> bool:
    return 0 < _batches_processed(trainer) < trainer.num_training_batches


def _fetched(trainer: Trainer) -> int:
    """The batches the fit loop's data fetcher has fetched since it last started."""
    # private: Lightning's data fetcher holds the count fetched; no public accessor
    fetcher = trainer.fit_loop._data_fetcher
    return fetcher.fetched if fetcher is not None else 0
