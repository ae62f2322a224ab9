"""Under threads: a SeededDataset that seeds the process-wide RNGs refuses loads off the main thread and
touches no state, and one that draws only from the sample's own generators is exact from any thread."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset
from torchdata.nodes import Loader, ParallelMapper, SamplerWrapper

from stateful_sampler import SampleKey, StatefulSampler
from stateful_sampler.seeding import GlobalRNGThreadError, SampleRNG, SeededDataset
from tests.seeding.test_seeding import global_states
from tests.seeding.test_seeding_batches import DrawsEverything

SIZE = 200
REFUSED = (
    r"SeededDataset seeds the process-wide .* loads only on the main thread, got a load on thread '.+'"
    r".*load_sample\(index, rng\).*global_rngs=\(\)"
)


class GeneratorsOnly(Dataset):
    """Augments from the sample's generators only, with enough work for threads to interleave (torch
    releases the GIL inside its kernels)."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> None:
        raise AssertionError("SeededDataset calls load_sample")

    def load_sample(self, index: int, rng: SampleRNG) -> tuple[int, float, float]:
        noise = torch.randn(20_000, generator=rng.torch).sum().item()
        return index, noise, float(rng.numpy.standard_normal(1000).sum())


def keys() -> list[SampleKey]:
    return list(StatefulSampler(SIZE, seed=21, yield_keys=True))


def test_four_threads_load_the_generator_streams_exactly_and_touch_no_global_state():
    dataset = SeededDataset(GeneratorsOnly(), global_rngs=())
    sequential = [dataset[key] for key in keys()]
    before = global_states()
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(dataset.__getitem__, keys()))
    assert threaded == sequential
    assert global_states() == before
    assert len({sample[1] for sample, _ in threaded}) == SIZE


def test_four_threads_loading_through_the_global_rngs_are_each_refused_and_change_nothing():
    dataset = SeededDataset(DrawsEverything())
    before = global_states()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(dataset.__getitem__, key) for key in keys()[:40]]
    for future in futures:
        with pytest.raises(GlobalRNGThreadError, match=REFUSED):
            future.result()
    assert global_states() == before


def test_a_batch_from_another_thread_is_refused_before_any_record_loads():
    loaded = []

    class Records(DrawsEverything):
        def __getitem__(self, index: int) -> tuple:
            loaded.append(index)
            return super().__getitem__(index)

    errors = []
    thread = threading.Thread(target=lambda: _capture(errors, SeededDataset(Records()).__getitems__, keys()[:8]))
    thread.start()
    thread.join()
    assert [type(error) for error in errors] == [GlobalRNGThreadError] and loaded == []


def _capture(errors: list, function, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 - handed to the main thread
        errors.append(error)


def torchdata_thread_map(dataset: SeededDataset) -> list:
    node = ParallelMapper(
        SamplerWrapper(StatefulSampler(SIZE, seed=21, yield_keys=True)),
        map_fn=dataset.__getitem__,
        num_workers=4,
        method="thread",
    )
    return list(Loader(node))


def test_torchdata_thread_mapping_gets_the_sequential_generator_streams():
    dataset = SeededDataset(GeneratorsOnly(), global_rngs=())
    before = global_states()
    assert torchdata_thread_map(dataset) == [dataset[key] for key in keys()]
    assert global_states() == before


def test_torchdata_thread_mapping_through_the_global_rngs_is_refused():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = global_states()
    with pytest.raises(GlobalRNGThreadError, match="loads only on the main thread"):
        torchdata_thread_map(SeededDataset(DrawsEverything()))
    assert global_states() == before
