"""The errors a user can act on, all in one place; each module that raises one re-exports it."""

from __future__ import annotations

from typing import Any


class IncompatibleStateError(ValueError):
    """A saved state cannot continue this sampler's order; names the field and both values."""

    def __init__(self, field: str, saved: Any, current: Any, reason: str = "") -> None:
        self.field = field
        self.saved = saved
        self.current = current
        detail = f": {reason}" if reason else ""
        super().__init__(f"state field {field!r}: saved {saved!r}, expected {current!r}{detail}")


class SamplerNotFoundError(TypeError):
    """The loader has no ``StatefulSampler`` where a ``DataLoader`` keeps its sampler."""


class DoubleShardingError(ValueError):
    """Both the ``StatefulSampler`` and a framework wrapper split the data between processes."""


class SamplerSetupError(ValueError):
    """A train loader that ``SamplerCheckpoint`` cannot resume exactly; the message names the fix."""


class GlobalRNGThreadError(RuntimeError):
    """A load that would seed the process-wide RNGs, from a thread other than the main thread."""


class ShardReadError(OSError):
    """A shard could not be read; the message names the file. Nothing already delivered is lost:
    the stream reads a window's rows before yielding any of them, and the position a loop saves
    counts only the batches it received."""


class StreamSetupError(ValueError):
    """A loader around a ``ShardedStream`` that would deliver other records than its state counts."""


class BatchSizeError(SamplerSetupError, StreamSetupError):
    """A loader whose batch size contradicts its order's, or that batches with neither known: the order counts
    consumed batches in its own batch size. Names both values. A ``SamplerSetupError`` and a ``StreamSetupError``
    (and so a ``ValueError``), as the core, Lightning and the stream raised before they shared one check."""

    field = "batch_size"

    def __init__(self, message: str, *, loader_batch_size: int | None, order_batch_size: int | None) -> None:
        self.loader_batch_size = loader_batch_size
        self.order_batch_size = order_batch_size
        super().__init__(message)


class ConfigError(ValueError):
    """A LightningCLI config that is missing, not YAML, or that LightningCLI refuses."""


class TrainingRunError(RuntimeError):
    """A training subprocess failed, overstayed its timeout, or never reached the kill point."""


class PrefetchedStateError(RuntimeError):
    """``sampler.state_dict()`` mid-pass where DataLoader workers drew ahead of training and no wrapping
    ``ResumableLoader`` says what was consumed; the message names the three exact ways to save."""


class StalePassError(RuntimeError):
    """A ``ResumableLoader`` iterator advanced after a newer ``iter(loader)`` or ``set_epoch`` replaced
    its pass: its batches would count against the new pass."""


class CertificateError(ValueError):
    """A data certificate that cannot be read or merged: not a certificate, another format version, a file
    altered or cut short, or ranks that do not add up to whole steps; the message names the file and step."""
