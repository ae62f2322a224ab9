"""``torch.distributed.checkpoint`` (DCP): every rank's loader state in the checkpoint, loadable at any world size.

DCP saves what each rank's ``state_dict()`` holds and, on load, asks each rank's ``state_dict()``
which keys to read. A key per rank (``rank3``) could not be asked for on a larger world, where
rank 3 may not have saved. So every rank's state goes under one key, as a list indexed by rank
(gathered at save; the same on every rank, so DCP writes it once), which any world size reads.
Loading checks that the saved ranks agree (the position is a global one: ranks in step save the
same) and continues from it; the sampler lays the rest of the epoch on the new ranks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.ranks import process_rank, process_world_size


class DistributedLoaderState:
    """A ``Stateful`` for ``dcp.save`` / ``dcp.load``: ``{"loader": DistributedLoaderState(loader), ...}``.

    ``state_dict`` is a collective when a process group exists (DCP's save and load are too).
    """

    def __init__(self, loader: ResumableLoader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        own = json.dumps(self.loader.state_dict(), sort_keys=True)
        world = process_world_size()
        if world == 1:
            return {"ranks": [own]}
        ranks: list[Any] = [None] * world
        dist.all_gather_object(ranks, own)
        return {"ranks": ranks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Each rank's RNG states (``ResumableLoader(rng_states=True)``) are its own; they go back to the same
        rank at the same world size, and at another one are not restored."""
        ranks = state.get("ranks") if isinstance(state, Mapping) else None
        if not isinstance(ranks, list) or not ranks or not all(isinstance(saved, str) for saved in ranks):
            raise IncompatibleStateError("ranks", ranks, "a list of each rank's state, from DistributedLoaderState")
        saved_states = [json.loads(saved) for saved in ranks]
        positions = [json.dumps(_without_rng(saved), sort_keys=True) for saved in saved_states]
        for rank, position in enumerate(positions):
            if position != positions[0]:
                raise IncompatibleStateError(
                    "ranks",
                    f"rank {rank}: {position}",
                    positions[0],
                    "the saving ranks were not in step (rank 0 differs)",
                )
        world = process_world_size()
        own = saved_states[process_rank()] if len(saved_states) == world else {**saved_states[0], "rng_states": None}
        self.loader.load_state_dict(own)


def _without_rng(state: Any) -> Any:
    return {key: value for key, value in state.items() if key != "rng_states"} if isinstance(state, dict) else state
