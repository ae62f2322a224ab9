"""Shared test drivers: run simulated ranks of a StatefulSampler epoch by epoch."""

from __future__ import annotations

import json
from typing import Any

from stateful_sampler import StatefulSampler


def make_ranks(size: int, world_size: int, **kwargs: Any) -> list[StatefulSampler]:
    return [StatefulSampler(size, num_replicas=world_size, rank=rank, **kwargs) for rank in range(world_size)]


def run_epochs(samplers: list[StatefulSampler], epochs: range) -> list[list[list[Any]]]:
    """``out[rank][i]`` is what rank yields in the i-th epoch of ``epochs``."""
    out: list[list[list[Any]]] = [[] for _ in samplers]
    for epoch in epochs:
        for rank, sampler in enumerate(samplers):
            sampler.set_epoch(epoch)
            out[rank].append(list(sampler))
    return out


def json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))
