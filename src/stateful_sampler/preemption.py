"""Save at the next step boundary when SLURM (or any scheduler) signals a preemption, then exit for requeue.

A signal arrives at any bytecode: in the middle of the loader's own bookkeeping, of ``optimizer.step()``
or of a checkpoint write. Saving there would take a torn state, so the handler only sets a flag; the
loop saves at its next step boundary, where the model, the optimizer and the loader agree.

``ResumableLoader`` counts a batch as consumed when it hands it to the loop, so a state taken after
a batch was handed out and before it was trained on skips that batch on resume. The boundary is
therefore *after* the optimizer step and *before* the next batch is fetched: ``Preemption.steps``
stops the iteration exactly there; a hand-written check belongs at the end of the loop body.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from stateful_sampler.checks import check_int

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["REQUEUE_EXIT_CODE", "Preemption", "PreemptionSetupError", "scontrol_requeue", "slurm_job_id"]

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". A wrapper script
# (`until python train.py; do :; done`) tells a preempted run (75) from a finished one (0).
REQUEUE_EXIT_CODE = 75

T = TypeVar("T")
Requeue = Callable[[str], None]
_Handler = Callable[[int, FrameType | None], Any] | int | None


class PreemptionSetupError(RuntimeError):
    """``Preemption`` entered where Python cannot install signal handlers (a thread other than the main one)."""


def slurm_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id ``scontrol requeue`` takes for this job: ``<array job>_<task>`` for an array task, else
    ``SLURM_JOB_ID``; ``None`` outside SLURM."""
    env = os.environ if environ is None else environ
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or None


def scontrol_requeue(job_id: str) -> None:
    """Ask SLURM to put ``job_id`` back in the queue (``scontrol requeue``); the job needs ``--requeue``
    or a cluster default that allows it."""
    subprocess.run(["scontrol", "requeue", job_id], check=True)


class Preemption:
    """Turn ``signals`` into a flag the training loop reads at its step boundary; save there, then requeue.

    Args:
        signals: the signals that announce a preemption (SLURM's ``--signal=USR1@90`` sends SIGUSR1,
            ``scancel`` and most schedulers SIGTERM).
        exit_code: the code ``exit_for_requeue`` exits with (default ``REQUEUE_EXIT_CODE``, 75).
        requeue: called with the job id by ``exit_for_requeue`` when one is known (``slurm_job_id``)
            and this is SLURM's task 0 (``SLURM_PROCID`` unset or 0: one requeue per job); default
            ``scontrol_requeue``; ``None`` to let the scheduler requeue on its own.
        chain: also call a Python handler that was installed before (a framework's), after the flag
            is set. The default actions (terminate) are never chained: the point is not to die.

    The handlers are installed on ``__enter__`` (main thread only, as Python requires) and the
    previous ones restored on ``__exit__``. Enter it before the ``DataLoader`` starts its workers:
    forked workers inherit the flag-setting handler instead of dying of a SIGUSR1 sent to the group.

    Example:
        >>> with Preemption() as preempt:                                   # doctest: +SKIP
        ...     for batch in preempt.steps(loader):    # stops before fetching the next batch
        ...         train_step(batch)                  # forward, backward, optimizer.step()
        ...     if preempt.requested:
        ...         save(model, optimizer, loader.state_dict())   # counts exactly the trained batches
        ...         preempt.exit_for_requeue()
    """

    def __init__(
        self,
        signals: Sequence[int] = (signal.SIGUSR1, signal.SIGTERM),
        *,
        exit_code: int = REQUEUE_EXIT_CODE,
        requeue: Requeue | None = scontrol_requeue,
        chain: bool = True,
    ) -> None:
        valid = set(signal.valid_signals())
        chosen = tuple(signals)
        if not chosen:
            raise ValueError("Preemption(signals=()): give at least one signal, e.g. (signal.SIGUSR1, signal.SIGTERM)")
        for number in chosen:
            if isinstance(number, bool) or not isinstance(number, int) or number not in valid:
                raise ValueError(
                    f"Preemption(signals=...): {number!r} is not a signal number; pass e.g. signal.SIGUSR1"
                )
            if number in (signal.SIGKILL, signal.SIGSTOP):
                raise ValueError(f"Preemption(signals=...): {signal.Signals(number).name} cannot be caught")
        self.signals = tuple(signal.Signals(number) for number in dict.fromkeys(chosen))
        self.exit_code = check_int("exit_code", exit_code, minimum=0, maximum=255)
        self.requeue = requeue
        self.chain = chain
        self.received: signal.Signals | None = None  # the first preemption signal, once one arrived
        self._previous: dict[signal.Signals, _Handler] = {}

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived; read it at the step boundary (after ``optimizer.step()``)."""
        return self.received is not None

    def _handle(self, number: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: set the flag, nothing else (no I/O, no lock,
        # no state_dict: the interrupted code may be halfway through updating that very state).
        if self.received is None:
            self.received = signal.Signals(number)
        previous = self._previous.get(signal.Signals(number))
        if self.chain and callable(previous):
            previous(number, frame)

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            raise PreemptionSetupError(
                f"Preemption must be entered in the main thread (Python runs signal handlers there only); "
                f"entered in thread {threading.current_thread().name!r}: enter it around the training loop "
                f"in the main thread, or let the framework that owns the thread handle the signal"
            )
        if self._previous:
            raise PreemptionSetupError("this Preemption is already entered: enter it once, around the training loop")
        for number in self.signals:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def steps(self, batches: Iterable[T]) -> Iterator[T]:
        """``batches``, stopping at the first step boundary after a preemption signal.

        The check runs when the loop asks for the next batch, i.e. after the body trained on the
        previous one and before the loader hands out (and counts) another: a ``loader.state_dict()``
        taken after the loop ends counts exactly the batches trained on."""
        iterator = iter(batches)
        while not self.requested:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            yield batch

    def exit_for_requeue(self) -> NoReturn:
        """Requeue the SLURM job (task 0, when a job id is known and ``requeue`` is set), then exit with
        ``exit_code``. Call it after the checkpoint is written and closed."""
        job_id = slurm_job_id()
        if job_id is not None and self.requeue is not None and os.environ.get("SLURM_PROCID", "0") == "0":
            self.requeue(job_id)
        raise SystemExit(self.exit_code)
