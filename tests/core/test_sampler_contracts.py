"""Each tail policy's coverage contract, exactly, per epoch; ``order="torch"`` equals DistributedSampler."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from stateful_sampler import SampleKey, StatefulSampler
from tests.helpers import make_ranks, run_epochs, scaled_examples

EDGE_SIZES = [0, 1, 2, 3, 4**8 - 1, 4**8, 4**8 + 1, 2**17 - 1, 2**17 + 1, 65537, 262145, 1048573]
sizes = st.one_of(st.integers(0, 300), st.integers(0, 10**6), st.sampled_from(EDGE_SIZES))
world_sizes = st.integers(1, 16)
batch_sizes = st.one_of(st.none(), st.integers(1, 64))
orders = st.sampled_from(["fast", "torch"])
seeds = st.integers(0, 2**63 - 1)


@settings(max_examples=scaled_examples(60))
@given(size=sizes, world_size=world_sizes, seed=seeds, epoch=st.integers(0, 10**6), order=orders, shuffle=st.booleans())
def test_pad_covers_every_record_once_and_marks_exactly_the_repeats(
    size: int, world_size: int, seed: int, epoch: int, order: str, shuffle: bool
) -> None:
    samplers = make_ranks(size, world_size, seed=seed, order=order, shuffle=shuffle, tail="pad", yield_keys=True)
    keys: list[SampleKey] = [key for rank in run_epochs(samplers, range(epoch, epoch + 1)) for key in rank[0]]
    per_rank = -(-size // world_size)
    assert [len(s) for s in samplers] == [per_rank] * world_size
    assert len(keys) == per_rank * world_size
    real = [key.index for key in keys if not key.is_padding]
    padding = [key for key in keys if key.is_padding]
    assert sorted(real) == list(range(size))
    assert len(padding) == per_rank * world_size - size
    assert all(key.position >= size and key.epoch == epoch for key in padding)
    # Padding repeats the start of the order, as torch does.
    by_position = {key.position: key.index for key in keys}
    assert all(key.index == by_position[key.position % size] for key in padding)


@settings(max_examples=scaled_examples(60))
@given(size=sizes, world_size=world_sizes, seed=seeds, order=orders)
def test_drop_takes_floor_and_reports_the_cut_records(size: int, world_size: int, seed: int, order: str) -> None:
    if 0 < size < world_size:
        size = world_size + size
    samplers = make_ranks(size, world_size, seed=seed, order=order, tail="drop")
    taken = [i for rank in run_epochs(samplers, range(2, 3)) for i in rank[0]]
    assert [len(s) for s in samplers] == [size // world_size] * world_size
    assert len(taken) == len(set(taken)) == size // world_size * world_size
    dropped = samplers[0].dropped_indices(2)
    assert sorted(taken + dropped) == list(range(size))
    assert all(s.dropped_indices(2) == dropped for s in samplers)


@settings(max_examples=scaled_examples(60))
@given(size=sizes, world_size=world_sizes, seed=seeds, order=orders)
def test_uneven_gives_every_record_exactly_once(size: int, world_size: int, seed: int, order: str) -> None:
    samplers = make_ranks(size, world_size, seed=seed, order=order, tail="uneven")
    per_rank = run_epochs(samplers, range(1))
    lengths = [len(rank[0]) for rank in per_rank]
    assert lengths == [len(s) for s in samplers]
    assert set(lengths) <= {size // world_size, -(-size // world_size)}
    assert sorted(i for rank in per_rank for i in rank[0]) == list(range(size))


@settings(max_examples=scaled_examples(60))
@given(
    size=st.one_of(st.integers(0, 300), st.integers(0, 20_000), st.sampled_from([4**8 + 1, 65537, 10**6])),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 64),
    epochs=st.integers(1, 6),
    seed=seeds,
    order=orders,
)
@example(10**6, 7, 33, 3, 11, "fast")
def test_carry_sees_every_record_once_per_epoch_but_a_final_remainder(
    size: int, world_size: int, batch_size: int, epochs: int, seed: int, order: str
) -> None:
    samplers = make_ranks(size, world_size, seed=seed, order=order, tail="carry", batch_size=batch_size)
    global_batch = batch_size * world_size
    counts = np.zeros(size, dtype=np.int64)
    for epoch in range(epochs):
        lengths = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            lengths.append(len(sampler))
            drawn = np.fromiter(sampler, dtype=np.int64)
            assert len(drawn) == lengths[-1]
            counts += np.bincount(drawn, minlength=size)
        assert len(set(lengths)) == 1 and lengths[0] % batch_size == 0  # whole global batches
    consumed = global_batch * (epochs * size // global_batch)
    assert int(counts.sum()) == consumed
    assert epochs * size - consumed < global_batch or size == 0  # only a final remainder is unseen
    if size:
        # What was consumed is a prefix of the stream of whole passes: each record `full` times,
        # the first `partial` records of the last pass once more.
        full, partial = divmod(consumed, size)
        assert set(np.unique(counts).tolist()) <= {full, full + 1}
        assert int((counts == full + 1).sum()) == partial
        assert full >= epochs - 1 or size < global_batch


def test_carry_remainder_rolls_into_the_next_epoch_in_order() -> None:
    """N=10, global batch 4. Epoch e takes the whole batches that fit before the end of pass e:
    epoch 0 = pass 0[:8]; epoch 1 = pass 0[8:] + pass 1 (12); epoch 2 = pass 2[:8]; epoch 3 = 12."""
    sampler = StatefulSampler(10, seed=3, tail="carry", batch_size=4)
    passes = [StatefulSampler(10, seed=3, tail="uneven").indices(p).tolist() for p in range(4)]
    expected = [passes[0][:8], passes[0][8:] + passes[1], passes[2][:8], passes[2][8:] + passes[3]]
    for epoch, records in enumerate(expected):
        sampler.set_epoch(epoch)
        assert (len(sampler), list(sampler)) == (len(records), records)
    assert [sampler.layout(e).stream_start for e in range(5)] == [0, 8, 20, 28, 40]
    assert [sampler.unused_indices(e) for e in range(3)] == [passes[0][8:], [], passes[2][8:]]
    assert sampler.dropped_indices(0) == []  # rolled over, not dropped


def test_shuffle_false_is_the_identity() -> None:
    assert list(StatefulSampler(7, shuffle=False)) == list(range(7))
    assert list(StatefulSampler(7, shuffle=False, num_replicas=3, rank=1)) == [1, 4, 0]


def test_torch_order_equals_distributed_sampler_on_200_configurations() -> None:
    rng = random.Random(20261130)
    for _ in range(200):
        size = rng.choice([rng.randint(0, 40), rng.randint(0, 5000)])
        world_size = rng.randint(1, 16)
        drop = rng.random() < 0.5 and size >= world_size
        rank, seed, epoch, shuffle = (
            rng.randrange(world_size),
            rng.randint(0, 2**40),
            rng.randint(0, 50),
            rng.random() < 0.8,
        )
        reference = DistributedSampler(range(size), world_size, rank, shuffle=shuffle, seed=seed, drop_last=drop)
        ours = StatefulSampler(
            size,
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            tail="drop" if drop else "pad",
            order="torch",
        )
        reference.set_epoch(epoch)
        ours.set_epoch(epoch)
        assert list(ours) == list(reference), (size, world_size, rank, seed, epoch, drop)
        assert len(ours) == len(reference)


def test_orders_are_pure_functions_of_seed_epoch_and_size() -> None:
    """Building, copying or moving a sampler never changes its order; no hidden RNG is forked."""
    first = StatefulSampler(1000, seed=9)
    first.set_epoch(4)
    np.random.seed(1)
    random.seed(2)
    second = StatefulSampler(1000, seed=9)
    second.set_epoch(4)
    assert list(first) == list(second) == second.indices(4).tolist()


def test_a_forgotten_set_epoch_moves_on_instead_of_replaying() -> None:
    sampler = StatefulSampler(50, seed=1)
    epochs = [list(sampler) for _ in range(3)]
    assert epochs == [sampler.indices(e).tolist() for e in range(3)]
    assert len({tuple(e) for e in epochs}) == 3
    assert sampler.epoch == 3


def test_set_epoch_keeps_the_current_epoch_position_and_resets_on_a_new_one() -> None:
    sampler = StatefulSampler(20, seed=1, batch_size=5)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    restored = StatefulSampler(20, seed=1, batch_size=5)
    restored.load_state_dict(sampler.state_dict())
    restored.set_epoch(0)  # Lightning calls set_epoch again on resume
    assert (
        head + list(restored) == StatefulSampler(20, seed=1).indices(0).tolist()
    )  # indices(): the rest, since issue 17
    restored.load_state_dict(sampler.state_dict())
    restored.set_epoch(1)
    assert list(restored) == sampler.indices(1).tolist()


def test_an_abandoned_pass_restarts_from_the_committed_position() -> None:
    sampler = StatefulSampler(30, seed=2)
    iterator = iter(sampler)
    [next(iterator) for _ in range(7)]
    assert sampler.state_dict()["position"] == 7
    assert list(sampler) == sampler.indices(0).tolist()  # like torch samplers: the epoch again
    assert sampler.epoch == 1


def test_pad_mask_excludes_padding_so_the_mean_is_exact() -> None:
    """10 records on 3 ranks: 12 slots, records repeated in 2 of them. Averaging a per-sample value
    with the padding excluded gives the dataset mean exactly; including it does not."""
    import torch
    from torch.utils.data import DataLoader

    from stateful_sampler import KeyedDataset

    values = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0], dtype=torch.float64)
    total, count, naive_total, naive_count = 0.0, 0, 0.0, 0
    for rank in range(3):
        sampler = StatefulSampler(10, num_replicas=3, rank=rank, seed=5, yield_keys=True)
        loader = DataLoader(KeyedDataset(values), sampler=sampler, batch_size=2)
        for batch_values, keys in loader:
            keep = ~keys.is_padding
            total += float(batch_values[keep].sum())
            count += int(keep.sum())
            naive_total += float(batch_values.sum())
            naive_count += len(batch_values)
    assert (count, naive_count) == (10, 12)
    assert total / count == float(values.mean())
    assert naive_total / naive_count != float(values.mean())


def test_keys_of_the_largest_seed_collate_into_tensors() -> None:
    import torch
    from torch.utils.data import DataLoader

    from stateful_sampler import KeyedDataset

    sampler = StatefulSampler(4, seed=2**63 - 1, yield_keys=True)
    ((values, keys),) = list(DataLoader(KeyedDataset(torch.arange(4)), sampler=sampler, batch_size=4))
    assert keys.seed.tolist() == [2**63 - 1] * 4
    assert sorted(values.tolist()) == [0, 1, 2, 3]


@given(size=st.integers(0, 500), world_size=st.integers(1, 8), batch_size=st.integers(1, 64), epoch=st.integers(0, 50))
def test_carry_hands_the_rest_of_its_permutation_to_the_next_epoch(
    size: int, world_size: int, batch_size: int, epoch: int
) -> None:
    sampler = StatefulSampler(size, num_replicas=world_size, rank=0, tail="carry", batch_size=batch_size)
    this, following = sampler.layout(epoch), sampler.layout(epoch + 1)
    rolled = this.unused_offsets()
    assert following.stream_start == this.stream_start + this.length == epoch * size + rolled.start
    assert rolled.stop == max(rolled.start, size)  # the rest of pass `epoch`, all of it if none fit
    assert len(rolled) < world_size * batch_size or this.length == 0
