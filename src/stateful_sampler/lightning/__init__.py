"""Lightning integration: exact mid-epoch resume for ``StatefulSampler`` train loaders.

``SamplerCheckpoint`` here is for ``lightning.pytorch``; ``stateful_sampler.pytorch_lightning`` has
the same callback for the classic ``pytorch_lightning`` package. Both come from ``callback.py``,
which imports neither package, so ``lightning`` is imported only when this ``SamplerCheckpoint`` is.
"""

from typing import Any

from stateful_sampler.lightning.loaders import SamplerSetupError

__all__ = ["SamplerCheckpoint", "SamplerSetupError"]


def __getattr__(name: str) -> Any:
    if name == "SamplerCheckpoint":
        from stateful_sampler.lightning.lightning_pytorch import SamplerCheckpoint

        return SamplerCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
