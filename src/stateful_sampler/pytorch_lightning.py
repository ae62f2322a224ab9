"""``SamplerCheckpoint`` for the classic ``pytorch_lightning`` package, whose ``Trainer`` refuses
``lightning.pytorch`` callbacks: the same implementation as ``stateful_sampler.lightning``'s,
under ``pytorch_lightning``'s ``Callback``."""

from pytorch_lightning import Callback

from stateful_sampler.lightning.callback import SamplerCheckpointHooks
from stateful_sampler.lightning.loaders import SamplerSetupError

__all__ = ["SamplerCheckpoint", "SamplerSetupError"]


class SamplerCheckpoint(SamplerCheckpointHooks, Callback):
    __doc__ = SamplerCheckpointHooks.__doc__
