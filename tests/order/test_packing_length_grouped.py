"""Length grouping without arithmetic: ``LengthGrouped`` takes the global batch B x W from its sampler."""

from __future__ import annotations

import numpy as np
import pytest

from stateful_sampler import LengthGrouped, StatefulSampler


def _padding(ranks, lengths, batch_size):
    """Padded tokens / all tokens, batch by batch on every rank (each batch padded to its longest)."""
    padded = real = 0
    for sampler in ranks:
        order = np.array(list(sampler))
        for start in range(0, len(order), batch_size):
            chosen = lengths[order[start : start + batch_size]]
            padded += int(chosen.max()) * len(chosen)
            real += int(chosen.sum())
    return 1 - real / padded


def test_the_global_batch_comes_from_the_sampler_and_matches_the_explicit_one():
    lengths = np.random.default_rng(0).lognormal(4, 1, 4000).astype(int) + 1
    world_size, batch = 8, 4
    taken = [StatefulSampler(4000, strategy=LengthGrouped(lengths), num_replicas=world_size, rank=r, batch_size=batch)
             for r in range(world_size)]  # fmt: skip
    explicit = [StatefulSampler(4000, strategy=LengthGrouped(lengths, batch_size=batch * world_size),
                                num_replicas=world_size, rank=r, batch_size=batch) for r in range(world_size)]  # fmt: skip
    assert taken[0].strategy.batch_size == 32
    assert [list(s) for s in taken] == [list(s) for s in explicit]
    assert taken[0].state_dict()["strategy_fingerprint"] == explicit[0].state_dict()["strategy_fingerprint"]
    per_rank_by_hand = LengthGrouped(lengths, batch_size=batch)  # what a per-rank value grouped before: 4 not 32
    assert per_rank_by_hand.for_sampler(None, 1) is per_rank_by_hand
    grouped_right = _padding([StatefulSampler(4000, strategy=LengthGrouped(lengths), num_replicas=world_size,
                                              rank=r, batch_size=batch, seed=1) for r in range(world_size)], lengths, batch)  # fmt: skip
    uniform = _padding([StatefulSampler(4000, num_replicas=world_size, rank=r, batch_size=batch, seed=1)
                        for r in range(world_size)], lengths, batch)  # fmt: skip
    assert grouped_right < uniform / 3


def test_a_contradicting_batch_size_is_refused_naming_both_values():
    lengths = np.arange(100) % 9 + 1
    with pytest.raises(ValueError, match=r"LengthGrouped\(batch_size=4\) contradicts the sampler's global batch "
                                         r"batch_size=4 x 8 ranks = 32"):  # fmt: skip
        StatefulSampler(100, strategy=LengthGrouped(lengths, batch_size=4), num_replicas=8, rank=0, batch_size=4)


def test_no_global_batch_anywhere_is_refused_at_construction():
    with pytest.raises(ValueError, match="give the sampler batch_size=B"):
        StatefulSampler(10, strategy=LengthGrouped(np.arange(10) + 1))
    assert list(StatefulSampler(10, strategy=LengthGrouped(np.arange(10) + 1, batch_size=5), seed=0))  # no sampler B
