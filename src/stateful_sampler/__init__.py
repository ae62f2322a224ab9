"""Checkpointable, exactly reproducible data order for PyTorch training.

Each name below is imported at its first use (``stateful_sampler.exports``): the command lines and verify's guard
process, which import this package first, start without torch."""

from typing import TYPE_CHECKING

from stateful_sampler.exports import lazy_exports

if TYPE_CHECKING:
    from stateful_sampler.errors import (
        BatchSizeError,
        DoubleShardingError,
        IncompatibleStateError,
        PrefetchedStateError,
        SamplerNotFoundError,
        SamplerSetupError,
        ShardReadError,
        StalePassError,
    )
    from stateful_sampler.keys import KeyedDataset, SampleKey
    from stateful_sampler.loader import ResumableLoader
    from stateful_sampler.order.curriculum import Curriculum
    from stateful_sampler.order.grouped import Grouped
    from stateful_sampler.order.length_grouped import LengthGrouped
    from stateful_sampler.order.mixture import Mixture
    from stateful_sampler.order.policies import Order, Tail
    from stateful_sampler.order.strategy import Strategy, Uniform
    from stateful_sampler.order.stratified import Stratified
    from stateful_sampler.order.weighted import Weighted
    from stateful_sampler.packing import Batch, PackedDataset, PackedRows, RowPlan, TokenBudgetBatches
    from stateful_sampler.sampler import StatefulSampler
    from stateful_sampler.seeding import (
        GlobalRNGThreadError,
        SampleRNG,
        SeededDataset,
        capture_rng_states,
        restore_rng_states,
        seed_worker,
    )
    from stateful_sampler.state import SamplerState

__version__ = "0.3.0"

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "stateful_sampler.errors": (
            "BatchSizeError",
            "DoubleShardingError",
            "IncompatibleStateError",
            "PrefetchedStateError",
            "SamplerNotFoundError",
            "SamplerSetupError",
            "ShardReadError",
            "StalePassError",
        ),
        "stateful_sampler.keys": ("KeyedDataset", "SampleKey"),
        "stateful_sampler.loader": ("ResumableLoader",),
        "stateful_sampler.order.curriculum": ("Curriculum",),
        "stateful_sampler.order.grouped": ("Grouped",),
        "stateful_sampler.order.length_grouped": ("LengthGrouped",),
        "stateful_sampler.order.mixture": ("Mixture",),
        "stateful_sampler.order.policies": ("Order", "Tail"),
        "stateful_sampler.order.strategy": ("Strategy", "Uniform"),
        "stateful_sampler.order.stratified": ("Stratified",),
        "stateful_sampler.order.weighted": ("Weighted",),
        "stateful_sampler.packing": ("Batch", "PackedDataset", "PackedRows", "RowPlan", "TokenBudgetBatches"),
        "stateful_sampler.sampler": ("StatefulSampler",),
        "stateful_sampler.seeding": (
            "GlobalRNGThreadError",
            "SampleRNG",
            "SeededDataset",
            "capture_rng_states",
            "restore_rng_states",
            "seed_worker",
        ),
        "stateful_sampler.state": ("SamplerState",),
    },
)

__all__ = [
    "Batch",
    "BatchSizeError",
    "Curriculum",
    "DoubleShardingError",
    "GlobalRNGThreadError",
    "Grouped",
    "IncompatibleStateError",
    "KeyedDataset",
    "LengthGrouped",
    "Mixture",
    "Order",
    "PackedDataset",
    "PackedRows",
    "PrefetchedStateError",
    "ResumableLoader",
    "RowPlan",
    "SampleKey",
    "SampleRNG",
    "SamplerNotFoundError",
    "SamplerSetupError",
    "SamplerState",
    "SeededDataset",
    "ShardReadError",
    "StalePassError",
    "StatefulSampler",
    "Strategy",
    "Stratified",
    "Tail",
    "TokenBudgetBatches",
    "Uniform",
    "Weighted",
    "capture_rng_states",
    "restore_rng_states",
    "seed_worker",
]
