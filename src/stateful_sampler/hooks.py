"""Every process-wide registry of the library, in one place: who hears of a pass start, a batch handed to
the loop, a state taken or loaded and a Lightning fit, and where an order asks how much of its pass was consumed.

The hooks are typed against protocols (``resumable.ResumableOrder`` and ``ConsumingLoader`` below), so
this module imports neither the sampler nor the loader: the orders fire the hooks, the loader feeds them,
and tools (verify) and integrations (Lightning) register, all from one floor below.

Example:
    >>> heard = []
    >>> remove = add_pass_start_hook(heard.append)
    >>> from stateful_sampler import StatefulSampler
    >>> _ = next(iter(StatefulSampler(4)))
    >>> len(heard), remove()
    (1, None)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from stateful_sampler.resumable import ResumableOrder


class ConsumingLoader(Protocol):
    """What a batch or state hook is given of the loader (a ``ResumableLoader``): the order it drives."""

    @property
    def sampler(self) -> ResumableOrder: ...


class TrainerObserver(Protocol):
    """What ``SamplerCheckpoint`` reports of a fit to a plugin, from Lightning's hooks."""

    def batch(self, trainer: Any, batch: Any, batch_idx: int) -> None: ...

    def checkpoint(self, trainer: Any) -> None: ...

    def train_end(self, trainer: Any, module: Any) -> None: ...

    def close(self) -> None: ...


PassStartHook = Callable[[ResumableOrder], None]
BatchHook = Callable[[ConsumingLoader, Any, int], None]
StateHook = Callable[[ConsumingLoader, int], None]
StateLoadedHook = Callable[[ConsumingLoader, "dict[str, Any]"], None]
ObserverFactory = Callable[[], "TrainerObserver | None"]
ConsumedSource = Callable[[], "int | None"]

_pass_start_hooks: list[PassStartHook] = []
_batch_hooks: list[BatchHook] = []
_state_hooks: list[StateHook] = []
_state_loaded_hooks: list[StateLoadedHook] = []
_observer_factories: list[ObserverFactory] = []
_consumed_sources: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # order -> WeakMethod


def _registered(hooks: list[Any], hook: Any) -> Callable[[], None]:
    hooks.append(hook)
    return lambda: hooks.remove(hook)


def add_pass_start_hook(hook: PassStartHook) -> Callable[[], None]:
    """Call ``hook(order)`` when any pass of an order starts, before it reads its epoch and position.

    A pass starts at the first ``next()`` of ``iter(sampler)``, which a ``DataLoader`` with workers reaches
    inside ``iter(loader)`` (a stream's at ``loader_pass``); this is the last moment to restore state into an
    order that was built after the checkpoint was read. Returns a function that removes it.
    """
    return _registered(_pass_start_hooks, hook)


def pass_starting(order: ResumableOrder) -> None:
    """Tell the pass-start hooks that a pass of ``order`` starts: what an order calls (sampler, stream)."""
    for hook in tuple(_pass_start_hooks):
        hook(order)


def add_batch_hook(hook: BatchHook) -> Callable[[], None]:
    """Call ``hook(loader, batch, consumed)`` for every batch any ``ResumableLoader`` hands to the loop.

    ``consumed`` counts the batches of the pass under way, this one included (1-based). This is the
    point where tools observe what training consumed without editing the user's loop (verify's
    batch recorder switches itself on through it). Returns a function that removes the hook.
    """
    return _registered(_batch_hooks, hook)


def batch_handed_out(loader: ConsumingLoader, batch: Any, consumed: int) -> None:
    """Tell the batch hooks that ``loader`` handed ``batch`` to the loop, the ``consumed``-th of its pass."""
    for hook in tuple(_batch_hooks):
        hook(loader, batch, consumed)


def add_state_hook(hook: StateHook) -> Callable[[], None]:
    """Call ``hook(loader, consumed)`` whenever any ``ResumableLoader`` gives its state (a checkpoint is being
    taken), with the batches of the pass under way it saves as consumed (0 when no pass is under way).
    Returns a function that removes it."""
    return _registered(_state_hooks, hook)


def state_taken(loader: ConsumingLoader, consumed: int) -> None:
    """Tell the state hooks that ``loader`` gives its state, after ``consumed`` batches of its pass."""
    for hook in tuple(_state_hooks):
        hook(loader, consumed)


def add_state_loaded_hook(hook: StateLoadedHook) -> Callable[[], None]:
    """Call ``hook(loader, sampler_state)`` whenever any ``ResumableLoader`` loads a state (a resume), with the
    order's state it continues from (its ``epoch`` and ``position``), after the load succeeded. Tools that
    describe a whole run across restarts (the certificate) learn here where the resumed process starts.
    Returns a function that removes it."""
    return _registered(_state_loaded_hooks, hook)


def state_loaded(loader: ConsumingLoader, sampler_state: dict[str, Any]) -> None:
    """Tell the state-loaded hooks that ``loader`` continues from ``sampler_state``."""
    for hook in tuple(_state_loaded_hooks):
        hook(loader, sampler_state)


def add_trainer_observer(factory: ObserverFactory) -> Callable[[], None]:
    """Offer ``factory`` to every ``SamplerCheckpoint`` set up for a fit: it returns an observer of
    that fit, or ``None`` to decline; every observer given hears of the fit. Returns a function that
    removes it."""
    return _registered(_observer_factories, factory)


def trainer_observers() -> list[TrainerObserver]:
    """The observers the registered factories give for a fit (verify's recording, the certificate), in
    registration order; none when no plugin is loaded here."""
    return [observer for factory in tuple(_observer_factories) if (observer := factory()) is not None]


def set_consumed_source(order: ResumableOrder, source: ConsumedSource) -> None:
    """Let ``order`` ask ``source`` (a bound method, held weakly, as the order is) how many of this rank's
    records of its pass under way training consumed: how a wrapping ``ResumableLoader`` tells
    ``sampler.state_dict()`` what it counted. An order that cannot be held weakly or hashed is not told."""
    try:
        _consumed_sources[order] = weakref.WeakMethod(source)  # type: ignore[arg-type]
    except TypeError:
        return


def consumed_count(order: ResumableOrder) -> int | None:
    """This rank's records of ``order``'s pass under way that a wrapping loader counts as consumed; ``None``
    when no loader counts (none wraps it, or its loader has no pass under way)."""
    try:
        source = _consumed_sources.get(order)
    except TypeError:
        return None
    method = source() if source is not None else None
    return method() if method is not None else None  # type: ignore[no-any-return]
