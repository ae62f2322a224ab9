"""The demo's assets: scikit-learn's digits as a ``StatefulSampler`` datamodule, a tiny classifier,
and the LightningCLI configs that train them (``digits.yaml``, and ``resume.yaml`` on top of it to
resume), shipped inside the package so that they work from an installed wheel.

Example:
    python -m stateful_sampler.demo --shipped-config > digits.yaml
    python -m stateful_sampler.demo fit --config digits.yaml
"""

from __future__ import annotations

from importlib.resources import files

CONFIGS = ("digits", "resume")


def shipped_config(name: str = "digits") -> str:
    """The text of a shipped config: ``digits`` (a fresh run) or ``resume`` (``ckpt_path: last``)."""
    if name not in CONFIGS:
        raise ValueError(f"name must be one of {list(CONFIGS)}, got {name!r}")
    return files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
