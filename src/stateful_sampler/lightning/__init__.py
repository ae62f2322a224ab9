"""Lightning integration: exact mid-epoch resume for ``StatefulSampler`` train loaders."""

from stateful_sampler.lightning.callback import SamplerCheckpoint
from stateful_sampler.lightning.loaders import SamplerSetupError

__all__ = ["SamplerCheckpoint", "SamplerSetupError"]
