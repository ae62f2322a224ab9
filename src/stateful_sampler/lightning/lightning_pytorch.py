"""``SamplerCheckpoint`` for ``lightning.pytorch``: the shared implementation under its ``Callback``."""

from stateful_sampler.extras import missing_extra

try:
    from lightning.pytorch import Callback
except ModuleNotFoundError as error:
    raise missing_extra(error, "lightning", "stateful_sampler.lightning") from error

from stateful_sampler.lightning.callback import SamplerCheckpointHooks


class SamplerCheckpoint(SamplerCheckpointHooks, Callback):
    __doc__ = SamplerCheckpointHooks.__doc__
