"""The strategy and the labels the audit command line describes: ``--strategy``, ``--labels``, ``--weights``.

The labels serve twice: they are the classes, groups or bands the strategy orders by, and the
classes whose batch composition the audit reports. The target each strategy aims at is the one the
composition is measured against: the weights' mass per class for ``weighted``, equal shares for
``stratified --mode balanced``, the labels' own distribution otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stateful_sampler.order.curriculum import Curriculum
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.strategy import Strategy, id_array, weight_array
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted

STRATEGIES = ("uniform", "weighted", "stratified", "grouped", "curriculum")
_BY_LABELS = {"stratified": "labels", "grouped": "groups", "curriculum": "bands"}


@dataclass(frozen=True)
class Described:
    strategy: Strategy | None  # None: the uniform default, shuffled or not as the flags say
    labels: np.ndarray | None
    target: dict[int, float] | None  # None: the labels' own distribution


def describe(name: str, labels_file: str | None, weights_file: str | None, mode: str | None) -> Described:
    """Build the strategy ``name`` from the given files; refuse files or flags it does not use."""
    if name not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {list(STRATEGIES)}, got {name!r}")
    labels = None if labels_file is None else id_array("--labels", _load(labels_file, "--labels"))
    weights = None if weights_file is None else weight_array("--weights", _load(weights_file, "--weights"))
    if weights is not None and name != "weighted":
        raise ValueError(f"--weights applies to --strategy weighted only, not {name}")
    if mode is not None and name != "stratified":
        raise ValueError(f"--mode applies to --strategy stratified only, not {name}")
    if labels is not None and weights is not None and len(labels) != len(weights):
        raise ValueError(f"--weights must have one entry per record: length {len(labels)}, got {len(weights)}")
    if name == "uniform":
        return Described(None, labels, None)
    if name == "weighted":
        if weights is None:
            raise ValueError("--strategy weighted needs --weights FILE.npy (one weight per record)")
        return Described(Weighted(weights), labels, None if labels is None else _mass(labels, weights))
    if labels is None:
        raise ValueError(f"--strategy {name} needs --labels FILE.npy (its {_BY_LABELS[name]}, one per record)")
    if name == "stratified":
        balanced = mode == "balanced"
        target = {int(c): 1.0 for c in np.unique(labels)} if balanced else None
        return Described(Stratified(labels, mode=mode or "proportional"), labels, target)
    if name == "grouped":
        return Described(Grouped(labels), labels, None)
    return Described(Curriculum(labels), labels, None)


def _mass(labels: np.ndarray, weights: np.ndarray) -> dict[int, float]:
    """Each class's share of the total weight: what weighted draws converge to."""
    classes, inverse = np.unique(labels, return_inverse=True)
    mass = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(classes))
    return {int(c): float(m) for c, m in zip(classes, mass)}


def _load(path: str, flag: str) -> np.ndarray:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{flag}: no such file: {path}")
    return np.load(path, allow_pickle=False)
