"""The seam products plug into, so the core never imports a product (verify, audit, demo).

A tool that observes a training process it does not own (``stateful-sampler verify`` records the
user's unedited script) names its module in ``STATEFUL_SAMPLER_PLUGINS`` (comma-separated) in the
process's environment. ``install()``, which the core calls when a ``ResumableLoader`` or
``SamplerCheckpoint`` is set up, imports each named module once and calls its ``install()``, which
registers through ``stateful_sampler.hooks`` (``add_batch_hook``, ``add_state_hook``,
``add_pass_start_hook``, ``add_trainer_observer``). Importing a plugin does nothing by itself (a module
without ``install()`` is only imported), and nothing is imported when the variable is unset.

A product a user switches on with a variable of its own (``STATEFUL_SAMPLER_CERTIFICATE=path``) is named in
``SWITCHES``: while its variable is set, its module is installed as if ``STATEFUL_SAMPLER_PLUGINS`` named it.

Example:
    >>> import os
    >>> os.environ.get(PLUGINS_ENV) is None and install() is None   # no plugin named: nothing is imported
    True
"""

from __future__ import annotations

import importlib
import os

from stateful_sampler.hooks import (
    ObserverFactory,  # noqa: F401 - re-exported, the registry lives in hooks
    TrainerObserver,
    add_trainer_observer,  # noqa: F401 - re-exported, the registry lives in hooks
)
from stateful_sampler.hooks import trainer_observers as registered_observers

PLUGINS_ENV = "STATEFUL_SAMPLER_PLUGINS"
# variable -> the plug-in module it switches on (a name, imported only while the variable is set)
SWITCHES = {"STATEFUL_SAMPLER_CERTIFICATE": "stateful_sampler.certificate.plugin"}

_loaded: set[str] = set()


def install() -> None:
    """Import each module ``STATEFUL_SAMPLER_PLUGINS`` names, and each of ``SWITCHES`` whose variable is set,
    and call its ``install()``, once per process and module; idempotent."""
    switched = [module for variable, module in SWITCHES.items() if os.environ.get(variable)]
    for name in [*(part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(",")), *switched]:
        if name and name not in _loaded:
            _loaded.add(name)
            try:
                module = importlib.import_module(name)
            except ImportError as error:
                raise ImportError(f"{PLUGINS_ENV}: cannot import the plugin module {name!r}: {error}") from error
            install_module = getattr(module, "install", None)
            if callable(install_module):
                install_module()


load_plugins = install  # the name of releases up to 0.3.0


def trainer_observers() -> list[TrainerObserver]:
    """The observers the plugins' factories give for a fit, after installing the plugins."""
    install()
    return registered_observers()
