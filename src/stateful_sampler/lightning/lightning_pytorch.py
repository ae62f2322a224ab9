"""``SamplerCheckpoint`` and the resume guard for ``lightning.pytorch``: the shared implementations under its
``Callback``."""

from stateful_sampler.extras import missing_extra

try:
    from lightning.pytorch import Callback
except ModuleNotFoundError as error:
    raise missing_extra(error, "lightning", "stateful_sampler.lightning") from error

from stateful_sampler.lightning.callback import SamplerCheckpointHooks
from stateful_sampler.lightning.guard import ResumeGuardHooks


class SamplerCheckpoint(SamplerCheckpointHooks, Callback):
    __doc__ = SamplerCheckpointHooks.__doc__


class StatefulSamplerResumeGuard(ResumeGuardHooks, Callback):
    """What the ``callbacks_factory`` entry point adds to every ``Trainer`` (``guard.py``): at module level, so
    that ``ddp_spawn`` can pickle it."""
