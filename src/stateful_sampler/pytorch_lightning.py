"""``SamplerCheckpoint`` for the classic ``pytorch_lightning`` package, whose ``Trainer`` refuses
``lightning.pytorch`` callbacks: the same implementation as ``stateful_sampler.lightning``'s,
under ``pytorch_lightning``'s ``Callback``."""

from stateful_sampler.extras import missing_extra
from stateful_sampler.lightning.callback import SamplerCheckpointHooks
from stateful_sampler.lightning.guard import ResumeGuardHooks
from stateful_sampler.lightning.loaders import SamplerSetupError

try:
    from pytorch_lightning import Callback
except ModuleNotFoundError as error:
    raise missing_extra(error, "pytorch-lightning", __name__) from error

__all__ = ["SamplerCheckpoint", "SamplerSetupError"]


# The hooks are typed against lightning.pytorch's Trainer and LightningModule; to mypy the classic
# package's same classes are other types, so the overrides look incompatible. At run time they are one.
class SamplerCheckpoint(SamplerCheckpointHooks, Callback):  # type: ignore[misc]
    __doc__ = SamplerCheckpointHooks.__doc__


class StatefulSamplerResumeGuard(ResumeGuardHooks, Callback):  # type: ignore[misc]
    """What the ``callbacks_factory`` entry point adds to every ``Trainer`` (``stateful_sampler.lightning.guard``):
    at module level, so that ``ddp_spawn`` can pickle it."""
