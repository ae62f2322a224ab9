"""What to audit: a live ``StatefulSampler``, or an ``AuditConfig`` describing one before it exists.

Either way the audit builds one real ``StatefulSampler`` per rank and asks it for its order, so
it answers from the code that produces the order, never from a re-implementation of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stateful_sampler.audit.report import AuditSettings
from stateful_sampler.checks import check_bool, check_int
from stateful_sampler.order.strategy import Strategy
from stateful_sampler.sampler import StatefulSampler

# Every fed occurrence is held as an int, with per-record counts per epoch and the batch-mate
# tallies: 10**8 of them take about 5.4 GiB and 96 s (cost.py). Past that the audit refuses instead
# of sampling, so no count is ever estimated.
MAX_OCCURRENCES = 10**8
# Each rank of each epoch is one sampler call with fixed costs (about 0.2 ms on 2 busy cores,
# whatever N is): 2**16 of them take about 15 s, so more ranks or epochs are refused, not waited on.
MAX_RANK_EPOCHS = 1 << 16
_INT64_MAX = (1 << 63) - 1  # the audit's arrays of records and stream positions are int64


@dataclass(frozen=True)
class AuditConfig:
    """A ``StatefulSampler``'s arguments plus the world size: the sampler every rank of a run would
    build. Its ``batch_size`` is the loader's, as the integrations build it."""

    size: int
    world_size: int = 1
    seed: int = 0
    shuffle: bool = True
    tail: str = "pad"
    order: str = "fast"
    strategy: Strategy | None = None  # the order of each pass (``Uniform()`` when None)


def rank_samplers(
    sampler_or_config: Any, *, batch_size: int | None, drop_last: bool, num_workers: int, start_epoch: int, epochs: int
) -> tuple[AuditSettings, list[StatefulSampler], int]:
    """Check the arguments and build the sampler of every rank; also the occurrences to be fed."""
    if isinstance(sampler_or_config, Mapping):
        sampler_or_config = AuditConfig(**sampler_or_config)
    if isinstance(sampler_or_config, StatefulSampler):
        template = sampler_or_config
        world_size = check_int("world_size (the sampler's num_replicas)", template.num_replicas, minimum=1,
                               maximum=MAX_RANK_EPOCHS)  # fmt: skip
        if batch_size is None:
            batch_size = template.batch_size
    elif isinstance(sampler_or_config, AuditConfig):
        world_size = check_int("world_size", sampler_or_config.world_size, minimum=1, maximum=MAX_RANK_EPOCHS)
        config = sampler_or_config
        template = StatefulSampler(
            config.size,
            shuffle=config.shuffle,
            seed=config.seed,
            num_replicas=world_size,
            rank=0,
            tail=config.tail,
            order=config.order,
            batch_size=batch_size,
            strategy=config.strategy,
        )
    else:
        raise TypeError(
            "sampler_or_config must be a StatefulSampler, an AuditConfig or a dict of AuditConfig fields, "
            f"got {type(sampler_or_config).__name__}"
        )
    if batch_size is None:
        raise ValueError("batch_size is required: the loader's per-rank batch (the sampler has none)")
    settings = AuditSettings(
        size=template.size,
        world_size=world_size,
        seed=template.seed,
        shuffle=template.shuffle,
        tail=template.tail.value,
        order=template.order.value,
        sampler_batch_size=template.batch_size,
        batch_size=check_int("batch_size", batch_size, minimum=1, maximum=_INT64_MAX),
        drop_last=check_bool("drop_last", drop_last),
        num_workers=check_int("num_workers", num_workers),
        start_epoch=check_int("start_epoch", start_epoch),
        epochs=check_int("epochs", epochs, minimum=1),
        strategy=template.strategy.name,
    )
    _check_work(settings)
    occurrences = settings.epochs * max(settings.size, template.layout(settings.start_epoch).length)
    if occurrences > MAX_OCCURRENCES:
        raise ValueError(
            f"size={settings.size} over epochs={settings.epochs} is {occurrences} occurrences, more than the "
            f"{MAX_OCCURRENCES} the audit holds to count exactly: audit fewer epochs per call (start_epoch picks them)"
        )
    samplers = [on_rank(template, world_size, rank) for rank in range(world_size)]
    return settings, samplers, occurrences


def _check_work(settings: AuditSettings) -> None:
    """Refuse, before any work, an audit whose cost has no bound: too many rank-epochs, or epochs
    so late that their stream positions (epoch * size) leave int64."""
    rank_epochs = settings.epochs * settings.world_size
    if rank_epochs > MAX_RANK_EPOCHS:
        raise ValueError(
            f"epochs={settings.epochs} on world_size={settings.world_size} ranks is {rank_epochs} rank-epochs, more "
            f"than the {MAX_RANK_EPOCHS} the audit computes per call: "
            "audit fewer epochs per call (start_epoch picks them)"
        )
    last_epoch = settings.start_epoch + settings.epochs - 1
    limit = (_INT64_MAX - settings.size - settings.world_size) // max(settings.size, 1)
    if last_epoch > limit:
        raise ValueError(
            f"start_epoch={settings.start_epoch} with epochs={settings.epochs} reaches epoch {last_epoch}, past the "
            f"last epoch {limit} whose stream positions (epoch * size) fit in int64 for size={settings.size}"
        )


def on_rank(template: StatefulSampler, world_size: int, rank: int) -> StatefulSampler:
    """The same sampler on rank ``rank`` of ``world_size``; its loaded state comes along, so a
    ``carry`` run that resumed with another global batch keeps the boundaries it already crossed."""
    clone = StatefulSampler(
        template.size,
        shuffle=template.shuffle,
        seed=template.seed,
        num_replicas=world_size,
        rank=rank,
        tail=template.tail,
        order=template.order,
        batch_size=template.batch_size,
        strategy=template.strategy,
    )
    clone.load_state_dict(template.state_dict())
    return clone
