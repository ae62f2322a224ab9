"""``wrappers.py``: the one table of where frameworks keep the loader and the sampler, walked through the real
wrappers (Accelerate, Fabric, Lightning, torchdata, our own), and the one batch-size check with its one error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader

from stateful_sampler import BatchSizeError, ResumableLoader, SamplerSetupError, StatefulSampler, TokenBudgetBatches
from stateful_sampler.stream import StreamSetupError
from stateful_sampler.wrappers import (
    MAX_WRAPPING,
    WRAPPED,
    BatchSizeWords,
    adopt_batch_size,
    batch_size_on,
    dataloaders_under,
    innermost_dataloader,
    loaders_in,
    path_to,
    path_to_order,
    samplers_at,
    walk,
)
from tests.stream_helpers import make_stream


def names(path: list[Any] | None) -> list[str]:
    return [type(obj).__name__ for obj in path or []]


class Holder:
    """A wrapper of our own making that keeps its loader where ResumableLoader does."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader


def test_the_table_has_one_row_per_attribute() -> None:
    attributes = [row.attribute for row in WRAPPED]
    assert len(attributes) == len(set(attributes))
    assert {"_dataloader", "base_dataloader", "flattened"} <= set(attributes)  # Fabric, Accelerate, Lightning


def test_a_dataloader_s_sampler_and_batch_sampler_lead_to_the_order() -> None:
    sampler = StatefulSampler(10, batch_size=2)
    plain = DataLoader(range(10), sampler=sampler, batch_size=2)
    assert names(path_to_order(plain)) == ["DataLoader", "StatefulSampler"] and batch_size_on(path_to_order(plain)) == 2
    batched = DataLoader(range(10), batch_sampler=BatchSampler(sampler, 2, drop_last=False))
    assert names(path_to_order(batched)) == ["DataLoader", "BatchSampler", "StatefulSampler"]
    assert path_to_order(DataLoader(range(10), shuffle=True)) is None


def test_a_stream_is_reached_through_the_loader_s_dataset() -> None:
    stream = make_stream([4, 3], batch_size=2)
    loader = ResumableLoader(stream.loader())
    path = path_to_order(loader)
    assert names(path) == ["ResumableLoader", "ShardedStream"]  # ResumableLoader.sampler is the order it drives
    assert path_to_order(loader.loader)[-1] is stream and batch_size_on(path_to_order(loader.loader)) == 2  # type: ignore[index]
    assert list(dataloaders_under(loader)) == [loader.loader] and innermost_dataloader(loader) is loader.loader


def test_accelerate_s_shard_and_torchdata_s_loader_are_walked() -> None:
    accelerate_data = pytest.importorskip("accelerate.data_loader")
    stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
    for stateful in (False, True):
        sampler = StatefulSampler(12, batch_size=3)
        prepared = accelerate_data.prepare_data_loader(
            DataLoader(range(12), sampler=sampler, batch_size=3),
            num_processes=1,
            process_index=0,
            use_stateful_dataloader=stateful,
        )
        base = prepared.base_dataloader
        assert type(base) is (stateful_dataloader.StatefulDataLoader if stateful else DataLoader)
        assert list(dataloaders_under(prepared)) == [prepared, base] and innermost_dataloader(prepared) is base
        path = path_to_order(ResumableLoader(prepared, rng_states=False).loader)
        assert path is not None and path[-1] is sampler and batch_size_on(path) == 3


@pytest.mark.slow  # importing Lightning costs about 9 s of CPU
def test_fabric_s_loader_is_walked() -> None:
    fabric_module = pytest.importorskip("lightning.fabric")
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    sampler = StatefulSampler(8, batch_size=2)
    original = DataLoader(range(8), sampler=sampler, batch_size=2)
    prepared = fabric.setup_dataloaders(original, move_to_device=False)
    assert type(prepared).__name__ == "_FabricDataLoader"
    assert innermost_dataloader(prepared) is original and path_to_order(prepared)[-1] is sampler  # type: ignore[index]
    assert list(dataloaders_under(Holder(prepared))) == [original]  # Fabric's wrapper poses as no DataLoader


@pytest.mark.slow  # importing Lightning costs about 9 s of CPU
def test_lightning_s_combined_loader_gives_its_loaders_in_order_and_is_not_walked_into() -> None:
    combined_module = pytest.importorskip("lightning.pytorch.utilities.combined_loader")
    first = DataLoader(range(4), sampler=StatefulSampler(4, batch_size=2), batch_size=2)
    second = DataLoader(range(6), sampler=StatefulSampler(6, batch_size=3), batch_size=3)
    combined = combined_module.CombinedLoader({"b": first, "a": second}, mode="max_size")
    assert loaders_in(combined) == [first, second] and loaders_in(first) == []
    assert path_to_order(combined) is None  # which of several orders is meant is the caller's to say


def test_samplers_at_a_loader_are_its_two_places_and_a_batch_sampler_of_ours() -> None:
    sampler = StatefulSampler(10, batch_size=2)
    batched = DataLoader(range(10), batch_sampler=BatchSampler(sampler, 2, drop_last=False))
    assert names(samplers_at(batched)) == ["SequentialSampler", "StatefulSampler"]
    budget = TokenBudgetBatches([3, 1, 2, 4], max_tokens=4)
    assert samplers_at(DataLoader(range(4), batch_sampler=budget))[1] is budget
    assert samplers_at(object()) == []


def chain(depth: int, end: Any) -> Any:
    for _ in range(depth):
        end = Holder(end)
    return end


def test_the_walk_stops_at_max_wrapping_wrappers_and_at_a_circle() -> None:
    sampler = StatefulSampler(4, batch_size=1)
    assert path_to_order(chain(MAX_WRAPPING, sampler)) is not None
    assert path_to_order(chain(MAX_WRAPPING + 1, sampler)) is None
    looped = Holder(None)
    looped.loader = Holder(looped)
    assert len(list(walk(looped))) == 2  # each object once


def test_path_to_finds_that_very_object() -> None:
    sampler = StatefulSampler(10, batch_size=2)
    loader = DataLoader(range(10), sampler=sampler, batch_size=2)
    assert path_to(loader, sampler) == [loader, sampler]
    assert path_to(loader, StatefulSampler(10, batch_size=2)) is None


WORDS = BatchSizeWords("DataLoader", "StatefulSampler", "; pass the same value to both", "train dataloader 1: ")


def test_a_contradiction_names_both_values_in_the_caller_s_words() -> None:
    sampler = StatefulSampler(10, batch_size=4)
    with pytest.raises(BatchSizeError) as raised:
        adopt_batch_size(sampler, 3, words=WORDS)
    assert str(raised.value) == (
        "train dataloader 1: DataLoader batch_size=3 contradicts StatefulSampler batch_size=4; pass the same value to both"
    )
    assert (raised.value.field, raised.value.loader_batch_size, raised.value.order_batch_size) == ("batch_size", 3, 4)
    assert isinstance(raised.value, SamplerSetupError) and isinstance(raised.value, StreamSetupError)
    assert isinstance(raised.value, ValueError)  # what the core raised before


def test_an_adopted_batch_size_is_checked_as_the_loader_s() -> None:
    with pytest.raises(ValueError, match=r"^the loader's batch_size must be at least 1 and at most \d+, got 0$"):
        adopt_batch_size(StatefulSampler(10), 0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ResumableLoader(DataLoader(range(10), sampler=StatefulSampler(10, batch_size=2), batch_size=5)),
            r"^the loader's batch_size=5 contradicts the sampler's batch_size=2: give the batch size once",
        ),
        (
            lambda: make_stream([4, 3], batch_size=2).loader(batch_size=3),
            r"^DataLoader batch_size=3 contradicts ShardedStream batch_size=2: a worker delivers whole batches",
        ),
        (
            lambda: ResumableLoader(Holder(StatefulSampler(4))),
            r"^ResumableLoader counts consumed batches, and neither Holder nor its StatefulSampler has a batch_size",
        ),
    ],
)
def test_the_core_and_the_stream_refuse_with_the_one_error(build: Callable[[], Any], message: str) -> None:
    with pytest.raises(BatchSizeError, match=message):
        build()


@given(
    order=st.none() | st.integers(1, 6),
    loader=st.none() | st.integers(1, 6),
    unbatched=st.booleans(),
)
def test_the_batch_size_is_taken_once_and_only_a_contradiction_is_refused(
    order: int | None, loader: int | None, unbatched: bool
) -> None:
    sampler = StatefulSampler(12, batch_size=order)
    contradiction = (loader is not None or not unbatched) and order is not None and loader != order
    if contradiction:
        with pytest.raises(BatchSizeError, match=f"batch_size={loader} contradicts the sampler's batch_size={order}"):
            adopt_batch_size(sampler, loader, unbatched=unbatched)
        assert sampler.batch_size == order
        return
    adopt_batch_size(sampler, loader, unbatched=unbatched)
    assert sampler.batch_size == (order if order is not None else loader)
