"""What a seed becomes in each RNG generator: the word layout shared by worker and sample seeding, and the
explicit per-sample generators.

Every generator depends on all 64 bits of its seed. Each takes its own words of the seed's words
(``order.mixing.seed_words``), so no two of them share draws. Python and NumPy take 64 bits through their own
array seeding; torch would keep only 32 bits of a seed, so its generators take a whole MT19937 state.
"""

from __future__ import annotations

import random
from functools import cache, cached_property

import numpy as np
import torch
from torch import Generator as TorchGenerator

from stateful_sampler.order.mixing import seed_words

_MT_WORDS = 624  # an MT19937 state, the generator behind random, NumPy's global RNG and torch's CPU RNG
# The word layout: which of a seed's words (``seed_words(seed, start, stop)``) each generator takes.
PYTHON_WORDS, NUMPY_WORDS = slice(0, 2), slice(2, 4)  # the global random and NumPy's legacy global RNG
TORCH_WORDS = slice(4, 4 + _MT_WORDS)  # torch's global CPU RNG
TORCH_GENERATOR_WORDS = slice(TORCH_WORDS.stop, TORCH_WORDS.stop + _MT_WORDS)  # ``SampleRNG.torch``
# torch's CPU generator state (``CPUGeneratorImplState``): the initial seed (u64), left (i32),
# seeded (i32), next (u64), the 624 MT19937 words (each as u64), then cached normals; 5056 bytes.
_TORCH_STATE_BYTES = 5056
_SEED_BYTES, _WORD_BYTES = slice(0, 8), slice(24, 24 + 8 * _MT_WORDS)


def seed_globals(seed: int) -> None:
    """Seed Python ``random``, NumPy's global RNG and torch's CPU RNG from one 64-bit seed."""
    words = seed_words(seed, 0, TORCH_WORDS.stop)
    low, high = words[PYTHON_WORDS].tolist()
    random.seed(low | high << 32)
    np.random.seed(words[NUMPY_WORDS])
    torch.set_rng_state(_torch_state(seed, words[TORCH_WORDS]))


def _torch_state(seed: int, words: np.ndarray) -> torch.Tensor:
    """torch's CPU generator state holding ``words`` as its MT19937 state, due to twist at the next draw."""
    return torch.from_numpy(torch_states(np.array([seed], dtype=np.uint64), words[None, :])[0])


def torch_states(seeds: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Row ``i``: the state of ``_torch_state(seeds[i], words[i])``, for a batch at once."""
    states = np.empty((len(seeds), _TORCH_STATE_BYTES), dtype=np.uint8)
    states[:] = _torch_state_template()
    states[:, _SEED_BYTES] = seeds.astype(np.uint64).view(np.uint8).reshape(-1, 8)  # torch.initial_seed() reports it
    states[:, _WORD_BYTES] = words.astype(np.uint64).view(np.uint8)
    return states


@cache
def _torch_state_template() -> np.ndarray:
    """A freshly seeded torch CPU generator state: left = 1 and next = 0, so the words written into it
    are twisted at the first draw, as after ``manual_seed``. torch keeps this layout so that RNG states
    in old checkpoints still load; a torch that changed it gets a clear error, not wrong streams.
    """
    probe = 0x1234567
    generator = torch.Generator()
    generator.manual_seed(probe)
    state = generator.get_state().numpy().copy()
    expected = np.array([probe, 1 | 1 << 32, 0, probe], dtype=np.uint64)  # seed, (left, seeded), next, word 0
    if state.size != _TORCH_STATE_BYTES or not np.array_equal(state[:32].view(np.uint64), expected):
        raise RuntimeError(
            f"torch {torch.__version__} keeps its CPU RNG state in a layout stateful_sampler.seeding does not "
            f"know (expected {_TORCH_STATE_BYTES} bytes of MT19937 state, got {state.size}); please report it"
        )
    return state


class SampleRNG:
    """Explicit generators for one sample, for transforms that take a generator instead of the globals.

    Each is built on first use from the sample's 64-bit ``seed``, and draws on its own, independently
    of the global generators seeded for the same sample.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @cached_property
    def numpy(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    @cached_property
    def torch(self) -> TorchGenerator:
        generator = TorchGenerator()
        words = seed_words(self.seed, TORCH_GENERATOR_WORDS.start, TORCH_GENERATOR_WORDS.stop)
        generator.set_state(_torch_state(self.seed, words))
        return generator
