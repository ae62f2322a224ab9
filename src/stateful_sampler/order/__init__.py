"""Pure order math: seed derivation, permutation, strategies and epoch layout. No torch in here."""

from stateful_sampler.order.curriculum import Curriculum
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.layout import EpochLayout, carry_epoch_start
from stateful_sampler.order.length_grouped import LengthGrouped
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.packing import pack_window
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.policies import Order, Tail
from stateful_sampler.order.rows import RowOrder
from stateful_sampler.order.shards import ShardedShuffle
from stateful_sampler.order.strategy import Strategy, Uniform
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted

__all__ = [
    "Curriculum",
    "Domain",
    "EpochLayout",
    "FeistelPermutation",
    "Grouped",
    "LengthGrouped",
    "Mixture",
    "Order",
    "RowOrder",
    "ShardedShuffle",
    "Strategy",
    "Stratified",
    "Tail",
    "Uniform",
    "Weighted",
    "carry_epoch_start",
    "derive_seed",
    "pack_window",
]
