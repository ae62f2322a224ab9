"""The seam products plug into, so the core never imports a product (verify, audit, demo).

A tool that observes a training process it does not own (``stateful-sampler verify`` records the
user's unedited script) names its module in ``STATEFUL_SAMPLER_PLUGINS`` (comma-separated) in the
process's environment. The core imports each named module once, when a ``ResumableLoader`` or
``SamplerCheckpoint`` is set up, and the module installs itself through the core's hooks:
``loader.add_batch_hook`` / ``add_state_hook``, ``sampler.add_pass_start_hook`` and, for a
Lightning fit, ``add_trainer_observer`` here. Nothing is imported when the variable is unset.

Example:
    >>> import os
    >>> os.environ.get(PLUGINS_ENV) is None and trainer_observer() is None   # no plugin: nothing observes
    True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Protocol

PLUGINS_ENV = "STATEFUL_SAMPLER_PLUGINS"


class TrainerObserver(Protocol):
    """What ``SamplerCheckpoint`` reports of a fit to a plugin, from Lightning's hooks."""

    def batch(self, trainer: Any, batch: Any, batch_idx: int) -> None: ...

    def checkpoint(self, trainer: Any) -> None: ...

    def train_end(self, trainer: Any, module: Any) -> None: ...

    def close(self) -> None: ...


ObserverFactory = Callable[[], "TrainerObserver | None"]
_observer_factories: list[ObserverFactory] = []
_loaded: set[str] = set()


def load_plugins() -> None:
    """Import each module ``STATEFUL_SAMPLER_PLUGINS`` names, once per process; idempotent."""
    for name in (part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(",")):
        if name and name not in _loaded:
            _loaded.add(name)
            try:
                importlib.import_module(name)
            except ImportError as error:
                raise ImportError(f"{PLUGINS_ENV}: cannot import the plugin module {name!r}: {error}") from error


def add_trainer_observer(factory: ObserverFactory) -> Callable[[], None]:
    """Offer ``factory`` to every ``SamplerCheckpoint`` set up for a fit: it returns an observer of
    that fit, or ``None`` to decline. Returns a function that removes it."""
    _observer_factories.append(factory)
    return lambda: _observer_factories.remove(factory)


def trainer_observer() -> TrainerObserver | None:
    """The first observer a plugin's factory gives for a fit, after loading the plugins; else ``None``."""
    load_plugins()
    for factory in tuple(_observer_factories):
        observer = factory()
        if observer is not None:
            return observer
    return None
