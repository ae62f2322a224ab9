"""The process's ranks, resolved late: an object built before ``init_process_group`` still shards right.

One rule for every order, stream and RNG snapshot: a rank or world size given explicitly wins; otherwise
the default process group's, or rank 0 of 1 without one.

Example:
    >>> resolve_ranks(4, 3)
    (4, 3)
    >>> resolve_ranks(None, None)  # no process group here
    (1, 0)
    >>> resolve_ranks(2, 2)
    Traceback (most recent call last):
    ...
    ValueError: rank must lie in [0, num_replicas) = [0, 2), got 2
"""

from __future__ import annotations

import torch.distributed as dist


def in_process_group() -> bool:
    """Whether this process has joined a default process group."""
    return dist.is_available() and dist.is_initialized()


def process_world_size() -> int:
    """The default process group's size, or 1 without one."""
    return dist.get_world_size() if in_process_group() else 1


def process_rank() -> int:
    """This process's rank in the default process group, or 0 without one."""
    return dist.get_rank() if in_process_group() else 0


def resolve_ranks(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """(world size, rank): the given ones, else the process group's; a rank outside the world refused."""
    world_size = num_replicas if num_replicas is not None else process_world_size()
    resolved = rank if rank is not None else process_rank()
    if resolved >= world_size:
        raise ValueError(f"rank must lie in [0, num_replicas) = [0, {world_size}), got {resolved}")
    return world_size, resolved
