"""Each silent case of issue 18 is now exact or refused: the loader's batching, a pass that moves on,
a consumed count past the pass, persistent workers, changed shard content, per-record seeding, and
errors that name their field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler import BatchSizeError, IncompatibleStateError
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.stream import KeyedTransform, SeededTransform, ShardedStream, StreamSetupError
from tests.stream_helpers import MemoryReader, make_stream

COUNTS = [3, 5]  # 8 records, batches of 2: 4 batches a pass


def ids(batches) -> list[list[int]]:
    """A batch of MemoryReader records collates to [names, rows]: name each record by (shard, row)."""
    return [[f"{name}:{int(row)}" for name, row in zip(*batch)] for batch in batches]


def sizes(passes) -> list[int]:
    return [sum(len(batch) for batch in batches) for batches in passes]


# -- 1. one source of truth for the batch size


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_plain_dataloader_of_another_batch_size_is_refused_at_its_first_batch(workers: int) -> None:
    stream = make_stream(COUNTS, batch_size=4)
    with pytest.raises(StreamSetupError, match=r"build it with stream.loader\(num_workers=\.\.\., \.\.\.\)"):
        next(iter(DataLoader(stream, batch_size=8, num_workers=workers)))


def test_stream_loader_takes_the_streams_batch_size_and_refuses_a_contradiction() -> None:
    stream = make_stream(COUNTS, batch_size=4)
    assert stream.loader().batch_size == 4 and sizes([ids(stream.loader())]) == [8]
    with pytest.raises(BatchSizeError, match=r"DataLoader batch_size=8 contradicts ShardedStream batch_size=4"):
        stream.loader(batch_size=8)
    with pytest.raises(BatchSizeError, match=r"DataLoader batch_size=None contradicts ShardedStream batch_size=4"):
        stream.loader(batch_size=None)
    with pytest.raises(StreamSetupError, match=r"drop_last=True would drop the pass's last, partial batch"):
        stream.loader(drop_last=True)
    with pytest.raises(StreamSetupError, match=r"shuffle: a ShardedStream orders its records itself"):
        stream.loader(shuffle=True)


# -- 2. a completed pass moves on


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_pass_resumed_mid_epoch_is_followed_by_whole_epochs_without_set_epoch(workers: int) -> None:
    live = make_stream(COUNTS, batch_size=2)
    loader = live.loader(num_workers=workers)
    uninterrupted = [ids(loader) for _ in range(3)]
    assert sizes(uninterrupted) == [8, 8, 8] and uninterrupted[0] != uninterrupted[1]  # epochs 0, 1, 2
    stopped = make_stream(COUNTS, batch_size=2)
    taken = ids(batch for _, batch in zip(range(3), stopped.loader(num_workers=workers)))
    resumed = make_stream(COUNTS, batch_size=2)
    resumed.load_state_dict(stopped.state_dict(consumed_batches=3))
    loader = resumed.loader(num_workers=workers)
    after = [ids(loader) for _ in range(3)]
    assert sizes(after) == [2, 8, 8]
    assert [taken + after[0], *after[1:]] == uninterrupted


def test_a_state_taken_after_the_loop_resumes_to_the_next_epoch_and_inside_it_to_nothing_more_first() -> None:
    stream = make_stream(COUNTS, batch_size=2)
    batches = list(stream.loader())
    after_loop, inside_loop = stream.state_dict(), stream.state_dict(consumed_batches=len(batches))
    assert (after_loop["epoch"], after_loop["position"]) == (1, 0)
    assert (inside_loop["epoch"], inside_loop["position"]) == (0, 8)
    for state, expected in ((after_loop, [8, 8]), (inside_loop, [0, 8])):
        resumed = make_stream(COUNTS, batch_size=2)
        resumed.load_state_dict(state)
        loader = resumed.loader()
        assert sizes([ids(loader), ids(loader)]) == expected


def test_state_dict_without_a_count_while_a_pass_is_under_way_is_refused() -> None:
    stream = make_stream(COUNTS, batch_size=2)
    iterator = iter(stream.loader())
    next(iterator)
    with pytest.raises(ValueError, match=r"consumed_batches: a pass of epoch 0 is under way"):
        stream.state_dict()


def test_a_pass_left_early_moves_on_and_set_epoch_of_its_own_epoch_changes_nothing() -> None:
    epochs = []
    for epoch in range(3):
        live = make_stream(COUNTS, batch_size=2)
        live.set_epoch(epoch)
        epochs.append(ids(live.loader()))
    stream = make_stream(COUNTS, batch_size=2)
    loader = stream.loader()
    assert ids(batch for _, batch in zip(range(2), loader)) == epochs[0][:2]
    stream.set_epoch(0)  # what Lightning and Accelerate do once a pass began: it goes on
    assert stream.epoch == 0 and stream.state_dict(consumed_batches=2)["position"] == 4
    assert ids(loader) == epochs[1]  # the next pass draws the next epoch
    stream.set_epoch(0)  # after a pass taken to its end: epoch 0 again, from its start
    assert ids(batch for _, batch in zip(range(1), loader)) == epochs[0][:1]
    stream.set_epoch(2)  # another epoch leaves the pass under way
    assert ids(loader) == epochs[2]


# -- 3. a consumed count past the pass


def test_consumed_batches_past_the_pass_is_refused() -> None:
    stream = make_stream(COUNTS, batch_size=2)
    assert stream.state_dict(consumed_batches=4)["position"] == 8
    with pytest.raises(ValueError, match=r"consumed_batches must be at most 4, the batches of this pass of epoch 0"):
        stream.state_dict(consumed_batches=10)
    resumed = make_stream(COUNTS, batch_size=2)
    resumed.load_state_dict(stream.state_dict(consumed_batches=1))
    with pytest.raises(ValueError, match=r"at most 3, the batches of this pass of epoch 0 \(from position 2\), got 4"):
        resumed.state_dict(consumed_batches=4)


# -- 4. persistent workers


def test_persistent_workers_are_refused_at_iter() -> None:
    stream = make_stream(COUNTS, batch_size=2)
    with pytest.raises(StreamSetupError, match=r"persistent_workers=True keeps workers that hold the epoch"):
        stream.loader(num_workers=1, persistent_workers=True)
    with pytest.raises(StreamSetupError, match=r"build it with stream.loader"):
        next(iter(DataLoader(stream, batch_size=2, num_workers=1, persistent_workers=True)))
    resumable = ResumableLoader(DataLoader(stream, batch_size=2, num_workers=1, persistent_workers=True))
    with pytest.raises(StreamSetupError, match=r"persistent_workers=True keeps workers"):
        iter(resumable).__next__()


# -- 5. content identity


class VersionedReader(MemoryReader):
    """Shards with a content version, as ``identity`` reports it."""

    def __init__(self, counts: list[int]) -> None:
        super().__init__(counts)
        self.versions = {name: "v1" for name in self.names}

    def identity(self, shard: str) -> str:
        return self.versions[shard]


def test_a_shard_whose_content_changed_under_the_same_name_and_count_is_refused_naming_it() -> None:
    reader = VersionedReader(COUNTS)
    state = ShardedStream(reader.names, reader, batch_size=2).state_dict(consumed_batches=1)
    reader.versions["shard-001"] = "v2"
    changed = ShardedStream(reader.names, reader, batch_size=2)
    with pytest.raises(IncompatibleStateError, match=r"state field 'shards\[1\]'.*'shard-001' with 5 records, "
                                                     r"content 'v2'.*shard 'shard-001' changed since the save"):  # fmt: skip
        changed.load_state_dict(state)
    reader.versions["shard-001"] = "v1"
    ShardedStream(reader.names, reader, batch_size=2).load_state_dict(state)


def test_a_reader_without_identity_keeps_the_name_and_count_identity() -> None:
    """Documented limit: without ``identity`` a rewritten shard of the same name and count is not detected,
    and states saved before identities existed still load."""
    plain = MemoryReader(COUNTS)
    state = ShardedStream(plain.names, plain, batch_size=2).state_dict(consumed_batches=1)
    ShardedStream(plain.names, MemoryReader(COUNTS), batch_size=2).load_state_dict(state)
    with pytest.raises(IncompatibleStateError, match=r"state field 'shards'.*several shards changed"):
        ShardedStream(plain.names, VersionedReader(COUNTS), batch_size=2).load_state_dict(state)  # identities added


def test_an_identity_that_is_not_a_str_is_refused_naming_the_shard() -> None:
    reader = VersionedReader(COUNTS)
    reader.versions["shard-000"] = 3
    with pytest.raises(TypeError, match=r"VersionedReader.identity\('shard-000'\) must return a str, got int 3"):
        ShardedStream(reader.names, reader, batch_size=2)


# -- 6. per-record seeding


def augment(record: tuple[str, int], rng) -> tuple[str, int, float]:
    name, row = record
    return name, row, float(rng.numpy.normal()) + float(torch.rand(1, generator=rng.torch))


def augmented(stream: ShardedStream, workers: int, stop_after: int | None = None) -> tuple[list, dict | None]:
    seen: list = []
    for consumed, (names, rows, noise) in enumerate(stream.loader(num_workers=workers), 1):
        seen += list(zip(names, rows.tolist(), noise.tolist()))
        if consumed == stop_after:
            return seen, stream.state_dict(consumed_batches=consumed)
    return seen, None


@pytest.mark.parametrize(("workers", "resumed_workers"), [(0, 0), pytest.param(2, 1, marks=pytest.mark.slow)])
def test_a_seeded_transform_draws_the_same_augmentation_after_a_resume_at_another_worker_count(
    workers: int, resumed_workers: int
) -> None:
    def stream(batch_size: int) -> ShardedStream:
        return make_stream([6, 7, 5], batch_size=batch_size, window=2, seed=9, transform=SeededTransform(augment))

    uninterrupted, _ = augmented(stream(2), workers)
    before, state = augmented(stream(2), workers, stop_after=3)
    resumed = stream(3)  # another batch size too
    resumed.load_state_dict(state)
    after, _ = augmented(resumed, resumed_workers)
    assert before + after == uninterrupted and len({noise for *_, noise in uninterrupted}) == 18


def test_a_seeded_transform_seeds_a_record_as_seeded_dataset_seeds_its_index() -> None:
    from stateful_sampler.keys import SampleKey
    from stateful_sampler.seeding import SeededDataset

    class Rows:
        def __len__(self) -> int:
            return 10

        def load_sample(self, index: int, rng) -> float:
            return float(rng.numpy.normal())

    key = SampleKey(index=7, seed=9, epoch=2, position=0, is_padding=False)
    from_dataset = SeededDataset(Rows(), global_rngs=())[key][0]
    assert SeededTransform(lambda record, rng: float(rng.numpy.normal()))(None, key) == from_dataset


def test_a_keyed_transform_receives_each_records_key() -> None:
    stream = make_stream(COUNTS, batch_size=2, transform=KeyedTransform(lambda record, key: (record, key.index)))
    order = stream.order.epoch(0).records(np.arange(8)).tolist()
    assert [index for _, index in stream] == order


# -- 7. errors that name their field


def test_swapped_shards_are_refused_naming_the_shard_order() -> None:
    reader = MemoryReader([4, 6, 2])
    state = ShardedStream(reader.names, reader, batch_size=2).state_dict(consumed_batches=1)
    swapped = ShardedStream([reader.names[1], reader.names[0], reader.names[2]], reader, batch_size=2)
    with pytest.raises(IncompatibleStateError, match=r"state field 'shard order': saved 'the same shards in another "
                                                     r"order'.*pass the shards in the order they were saved with"):  # fmt: skip
        swapped.load_state_dict(state)


def test_a_reader_returning_a_generator_is_refused_naming_the_shard_and_rows() -> None:
    class Lazy(MemoryReader):
        def read(self, shard: str, start: int, stop: int):  # type: ignore[override]
            return (record for record in super().read(shard, start, stop))

    reader = Lazy([4])
    with pytest.raises(TypeError, match=r"Lazy.read\('shard-000', 0, 4\) returned a generator, not a sequence: "
                                        r"read must return the 4 records of rows 0..3 of shard 'shard-000'"):  # fmt: skip
        list(ShardedStream(reader.names, reader, batch_size=2, window=1, spread=1))


def test_an_epoch_past_the_limit_is_refused_at_set_epoch() -> None:
    stream = make_stream(COUNTS, batch_size=2)
    with pytest.raises(
        ValueError, match=r"epoch must be at least 0 and at most 4611686018427387903, got 18446744073709551616"
    ):
        stream.set_epoch(2**64)
    assert stream.epoch == 0


# -- 8. a dataset that wraps the stream (issue 25, item 3)


class Wrap(torch.utils.data.IterableDataset):
    """A user's dataset around the stream: the DataLoader batches its records, not the stream."""

    def __init__(self, stream: ShardedStream, as_generator: bool) -> None:
        self.dataset, self.as_generator = stream, as_generator

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self.as_generator:
            return (record for record in self.dataset)
        return iter(self.dataset)


@pytest.mark.parametrize("as_generator", [False, True], ids=["iter", "generator"])
@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_dataset_wrapping_the_stream_is_refused_at_0_workers_as_with_workers(
    workers: int, as_generator: bool
) -> None:
    """At 0 workers the wrapper once hid the stream: batches of 5 went through while a state counted the
    stream's batches of 4, and a resume after 3 batches repeated 3 records."""
    stream = make_stream([6, 6], batch_size=4)
    with pytest.raises(StreamSetupError, match=r"a DataLoader\(stream, \.\.\.\) of its own does not tell the stream"):
        next(iter(DataLoader(Wrap(stream, as_generator), batch_size=5, num_workers=workers)))
    with pytest.raises(StreamSetupError, match=r"found no DataLoader over this ShardedStream in DataLoader"):
        next(iter(ResumableLoader(DataLoader(Wrap(stream, as_generator), batch_size=4, num_workers=workers))))
    assert sizes([ids(stream.loader(num_workers=workers))]) == [12]  # the stream itself still loads
