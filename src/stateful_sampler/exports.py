"""A package's re-exported names, each imported at its first use (PEP 562).

Why: ``import stateful_sampler.cli`` runs ``stateful_sampler/__init__.py`` first. Had that imported its exports at
once, every command line (``stateful-sampler verify``, ``certificate compare``) and verify's guard process would
import torch, about 2.5 s of CPU before their first line, though none of them trains. ``from stateful_sampler import
X`` and ``stateful_sampler.X`` work as before: the module holding ``X`` is imported at that moment, and so is a
submodule named as an attribute (``stateful_sampler.errors`` after ``import stateful_sampler``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, which re-exports each module's names of ``exports``.

    Example:
        >>> getattr_, dir_ = lazy_exports("json", {"json.decoder": ("JSONDecoder",)})
        >>> getattr_("JSONDecoder").__name__, "JSONDecoder" in dir_()
        ('JSONDecoder', True)
    """
    namespace = sys.modules[package].__dict__
    homes = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")  # a submodule, as an eager package had imported it
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # the next use is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
