"""Checkpointable, exactly reproducible data order for PyTorch training."""

from stateful_sampler.errors import IncompatibleStateError
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
from stateful_sampler.packed_dataset import PackedDataset
from stateful_sampler.packed_rows import PackedRows, RowPlan
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.seeding import GlobalRNGThreadError, SampleRNG, SeededDataset, seed_worker
from stateful_sampler.state import SamplerState
from stateful_sampler.token_budget import Batch, TokenBudgetBatches

__version__ = "0.2.0"

__all__ = [
    "Batch",
    "Curriculum",
    "GlobalRNGThreadError",
    "Grouped",
    "IncompatibleStateError",
    "KeyedDataset",
    "LengthGrouped",
    "Mixture",
    "Order",
    "PackedDataset",
    "PackedRows",
    "RowPlan",
    "ResumableLoader",
    "SampleKey",
    "SampleRNG",
    "SamplerState",
    "SeededDataset",
    "StatefulSampler",
    "Strategy",
    "Stratified",
    "Tail",
    "TokenBudgetBatches",
    "Uniform",
    "Weighted",
    "seed_worker",
]
