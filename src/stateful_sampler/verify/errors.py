"""What stops verify from reaching a verdict: the reasons it reports with exit code 2 (defined with
the other user-facing errors in ``stateful_sampler.errors``)."""

from stateful_sampler.errors import ConfigError, TrainingRunError

__all__ = ["ConfigError", "TrainingRunError"]
