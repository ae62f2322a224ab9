"""Pure order math: seed derivation, permutation and epoch layout. No torch in here."""

from stateful_sampler.order.layout import EpochLayout, Tail, carry_epoch_start
from stateful_sampler.order.mixing import Domain, derive_seed
from stateful_sampler.order.permutation import FeistelPermutation
from stateful_sampler.order.shards import ShardedShuffle

__all__ = ["Domain", "EpochLayout", "FeistelPermutation", "ShardedShuffle", "Tail", "carry_epoch_start", "derive_seed"]
