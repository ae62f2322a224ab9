"""``SamplerCheckpoint`` for ``lightning.pytorch``: the shared implementation under its ``Callback``."""

from lightning.pytorch import Callback

from stateful_sampler.lightning.callback import SamplerCheckpointHooks


class SamplerCheckpoint(SamplerCheckpointHooks, Callback):
    __doc__ = SamplerCheckpointHooks.__doc__
