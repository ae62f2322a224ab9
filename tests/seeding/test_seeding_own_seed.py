"""SeededDataset's own augmentation seed varies the augmentation and not the order, and the order's seed
varies the order and not each record's augmentation; bad keys and arguments get errors that name the fix."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from stateful_sampler import SampleKey, StatefulSampler
from stateful_sampler.seeding import SeededDataset
from tests.seeding.test_seeding_batches import DrawsEverything, WithGenerators
from tests.seeding.test_seeding_loader import Augmented

SIZE = 22


def epoch_rows(order_seed: int, augmentation_seed: int | None, epoch: int = 1) -> list[tuple]:
    """(index, augmentation) of each sample of one epoch, in the order loaded."""
    sampler = StatefulSampler(SIZE, seed=order_seed, batch_size=4, yield_keys=True)
    sampler.set_epoch(epoch)
    loader = DataLoader(SeededDataset(Augmented(), seed=augmentation_seed), sampler=sampler, batch_size=4)
    return [(int(row[0]), tuple(row[1:].tolist())) for samples, _ in loader for row in samples]


def test_the_augmentation_seed_changes_every_records_augmentation_and_not_the_order():
    first, second = epoch_rows(5, 100), epoch_rows(5, 101)
    assert [index for index, _ in first] == [index for index, _ in second]
    assert all(a != b for (_, a), (_, b) in zip(first, second))


def test_the_order_seed_changes_the_order_and_not_any_records_augmentation():
    first, second = epoch_rows(5, 100), epoch_rows(6, 100)
    assert [index for index, _ in first] != [index for index, _ in second]
    assert dict(first) == dict(second)
    assert len(dict(first)) == SIZE


def test_without_its_own_seed_the_augmentation_follows_the_samplers_seed():
    assert epoch_rows(5, None) == epoch_rows(5, 5)
    assert dict(epoch_rows(5, None)) != dict(epoch_rows(6, None))


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (-1, ValueError, r"seed must be at least 0 and at most 9223372036854775807, got -1"),
        (2**63, ValueError, r"seed must be at least 0 and at most 9223372036854775807, got 9223372036854775808"),
        ("7", TypeError, r"seed must be an int, got str '7'"),
        (True, TypeError, r"seed must be an int, got bool True"),
    ],
)
def test_an_augmentation_seed_outside_0_to_2_63_is_refused(seed, error, message):
    with pytest.raises(error, match=message):
        SeededDataset(DrawsEverything(), seed=seed)


def collated_key() -> SampleKey:
    loader = DataLoader(
        SeededDataset(DrawsEverything()), batch_size=2, sampler=StatefulSampler(4, seed=3, yield_keys=True)
    )
    return next(iter(loader))[1]


@pytest.mark.parametrize("take", [lambda keys: keys, lambda keys: SampleKey(*(field[0] for field in keys))])
def test_a_key_whose_fields_are_tensors_gets_a_type_error_naming_the_field_and_the_fix(take):
    key = take(collated_key())
    expected = (
        r"SeededDataset needs a SampleKey of ints, got SampleKey.index = Tensor tensor\(.*\): a collated batch "
        r"of keys .* is not a key. Pass the sampler's keys one by one, as DataLoader\(dataset, sampler=sampler\) "
        r"does; to rebuild one key from a batch, take int\(...\) of each field"
    )
    with pytest.raises(TypeError, match=expected):
        SeededDataset(DrawsEverything())[key]


def test_a_key_rebuilt_with_ints_from_a_collated_batch_is_the_samplers_key():
    rebuilt = SampleKey(*(field[1].item() for field in collated_key()))
    original = list(StatefulSampler(4, seed=3, yield_keys=True))[1]
    assert rebuilt == original
    assert SeededDataset(DrawsEverything())[rebuilt] == SeededDataset(DrawsEverything())[original]


def test_a_key_field_outside_64_bits_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"SampleKey.epoch must lie in \[0, 2\*\*64\), got -1"):
        SeededDataset(DrawsEverything())[SampleKey(1, 2, -1, 0, False)]


@pytest.mark.parametrize(
    ("dataset", "global_rngs", "message"),
    [
        (
            WithGenerators(),
            ("torch", "cuda"),
            r"global_rngs must name some of \['random', 'numpy', 'torch'\], got 'cuda'",
        ),
        (DrawsEverything(), (), r"global_rngs=\(\) seeds nothing for DrawsEverything, which has no load_sample"),
    ],
)
def test_global_rngs_that_name_an_unknown_rng_or_seed_nothing_are_refused(dataset, global_rngs, message):
    with pytest.raises(ValueError, match=message):
        SeededDataset(dataset, global_rngs=global_rngs)
