"""Checkpointable, exactly reproducible data order for PyTorch training."""

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.keys import KeyedDataset, SampleKey
from stateful_sampler.order.layout import Tail
from stateful_sampler.orders import Order
from stateful_sampler.sampler import StatefulSampler, add_pass_start_hook
from stateful_sampler.seeding import GlobalRNGThreadError, SampleRNG, SeededDataset, seed_worker
from stateful_sampler.state import SamplerState

__version__ = "0.1.0"

__all__ = [
    "GlobalRNGThreadError",
    "IncompatibleStateError",
    "KeyedDataset",
    "Order",
    "SampleKey",
    "SampleRNG",
    "SamplerState",
    "SeededDataset",
    "StatefulSampler",
    "Tail",
    "add_pass_start_hook",
    "seed_worker",
]
