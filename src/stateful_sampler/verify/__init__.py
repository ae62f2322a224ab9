"""``stateful-sampler verify``: prove that a run killed with SIGKILL and resumed equals an uninterrupted one.

The core (running, killing, recording, comparing) imports no training framework. Runners: a
LightningCLI config (``verify.lightning_cli``, the only module here importing Lightning) and any
command (``verify.command``), recorded through the library's own ``ResumableLoader`` hook.
"""

from typing import TYPE_CHECKING

from stateful_sampler.exports import lazy_exports

if TYPE_CHECKING:
    from stateful_sampler.verify.loader_hook import record_weights

# at its first use: verify's guard process imports this package and needs no torch
__getattr__, __dir__ = lazy_exports(__name__, {"stateful_sampler.verify.loader_hook": ("record_weights",)})

__all__ = ["record_weights"]
