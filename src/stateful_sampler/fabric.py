"""Lightning Fabric: ``fabric.setup_dataloaders`` with the sampler kept, and the consumed position in ``fabric.save``.

Fabric keeps a ``DistributedSampler`` subclass at ``loader.sampler`` as it is under DDP, so the
``StatefulSampler`` shards and Fabric does not. Fabric also calls ``set_epoch`` on the sampler at
every pass with its own count of passes, which a resumed process restarts at 0; the returned
loader keeps that count equal to the sampler's epoch, so a restored epoch is not rewound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from torch.utils.data import DataLoader

from stateful_sampler.extras import missing_extra
from stateful_sampler.loader import ResumableLoader, find_sampler

try:
    from lightning.fabric import Fabric
except ModuleNotFoundError as error:
    raise missing_extra(error, "fabric", __name__) from error

if TYPE_CHECKING:
    # private: Fabric's loader type, for typing only: Fabric exports no public name for it
    from lightning.fabric.wrappers import _FabricDataLoader


def setup_dataloader(
    fabric: Fabric, loader: DataLoader, *, move_to_device: bool = True, rng_states: bool = True
) -> ResumableLoader:
    """``fabric.setup_dataloaders(loader)`` as a ``ResumableLoader``: put it in ``fabric.save``'s state as is.

    ``rng_states`` (default on: ``fabric.save`` does not save them) puts every process's RNG states (torch CPU
    and CUDA, NumPy, ``random``) in the loader's state, and ``fabric.load`` gives each process its own back, so
    a model with dropout resumes bitwise. Load the loader after anything else that draws from them. At another
    world size they are not restored (no uninterrupted run has those ranks' randomness; a warning says so).

    Example::

        loader = setup_dataloader(fabric, DataLoader(ds, sampler=StatefulSampler(ds, batch_size=B), batch_size=B))
        fabric.save(path, {"model": model, "optimizer": optimizer, "loader": loader})
        fabric.load(path, {"model": model, "optimizer": optimizer, "loader": loader})   # O(1), no replay
    """
    sampler = find_sampler(loader)
    if sampler.num_replicas != fabric.world_size:
        raise ValueError(
            f"the StatefulSampler shards over num_replicas={sampler.num_replicas} but Fabric runs "
            f"world_size={fabric.world_size} processes: call fabric.launch() before building the sampler, or leave "
            f"num_replicas and rank unset"
        )
    # one loader in, one out: a _FabricDataLoader, which Fabric types as DataLoader | list[DataLoader]
    prepared = cast("_FabricDataLoader", fabric.setup_dataloaders(loader, move_to_device=move_to_device))
    if find_sampler(prepared) is not sampler:
        raise ValueError(
            "Fabric replaced the StatefulSampler: pass it as DataLoader(dataset, sampler=StatefulSampler(...)), where "
            "Fabric keeps a DistributedSampler, not inside a custom batch_sampler"
        )

    def sync_fabric_epoch(epoch: int) -> None:
        # private: Fabric's count of passes, which it passes to set_epoch; no public setter exists
        prepared._num_iter_calls = epoch  # Fabric's pass count, which it passes to sampler.set_epoch

    return _FabricLoader(prepared, epoch_sync=sync_fabric_epoch, rng_states=rng_states)


class _FabricLoader(ResumableLoader):
    """Under several processes ``fabric.save`` writes rank 0's state only, and asks every rank for it: the
    state gathers every rank's RNG states (``ResumableLoader.state_dict(every_rank=True)``), and on load
    each rank takes its own, as any ``ResumableLoader`` does."""

    def state_dict(self, *, every_rank: bool = True) -> dict[str, Any]:
        return super().state_dict(every_rank=every_rank)
