"""Optional integrations and the extra that installs each: a framework that is not installed is
named, with the ``pip install`` command that brings it, at the import that needed it."""

from __future__ import annotations


def missing_extra(error: ModuleNotFoundError, extra: str, feature: str) -> ModuleNotFoundError:
    """``error`` (a framework ``feature`` could not import) reworded as its fix.

    Example:
        try:
            from accelerate import Accelerator
        except ModuleNotFoundError as error:
            raise missing_extra(error, "accelerate", "stateful_sampler.accelerate") from error
    """
    package = (error.name or "a package").partition(".")[0]  # the distribution's top-level module
    return ModuleNotFoundError(
        f"{feature} needs {package}, which is not installed: pip install 'stateful-sampler[{extra}]'",
        name=package,
    )
