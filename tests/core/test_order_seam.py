"""The seam between ``ResumableLoader`` and the orders is public: an order written here, against
``ResumableOrder``'s members alone (nothing of the library's subclassed or reached into), plugs into the
loader and resumes exactly under real DataLoader workers (0 and 2)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import stateful_sampler.loader as loader_module
from stateful_sampler import StatefulSampler
from stateful_sampler.hooks import add_batch_hook, add_pass_start_hook, add_state_hook, pass_starting
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.resumable import DatasetOrder, ResumableOrder

N, B = 23, 4  # a partial last batch: 6 batches an epoch


class _Pass:
    def __init__(self, epoch: int, origin: int) -> None:
        self.epoch, self.origin, self.drawn, self.finished = epoch, origin, 0, False


class ThirdPartyOrder:
    """A shuffled order of N records on one rank, by (seed, epoch): a third party's, knowing only the protocol."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed = size, seed
        self.batch_size: int | None = None  # the loader's is taken
        self._epoch, self._position = 0, 0
        self._pass: _Pass | None = None

    # -- ResumableOrder

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def num_replicas(self) -> int:
        return 1

    @property
    def pass_begun(self) -> bool:
        return self._pass is not None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch or (self._pass is not None and self._pass.finished):
            self._epoch, self._position, self._pass = epoch, 0, None

    def __len__(self) -> int:
        return self.size

    def remaining_length(self) -> int:
        """From the pass's start while one is under way (the loader asks at a pass's start), else the cursor."""
        start = self._position if self._pass is None or self._pass.finished else self._pass.origin
        return self.size - start

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        if consumed_batches is not None:
            return self.state_after(consumed_batches * (self.batch_size or 1))
        if self._pass is not None and not self._pass.finished:
            return self._state(self._pass.epoch, self._pass.origin + self._pass.drawn)
        return self._state(self._epoch, self._position)

    def state_after(self, consumed: int) -> dict[str, Any]:
        epoch, origin = (self._epoch, self._position) if self._pass is None else (self._pass.epoch, self._pass.origin)
        return self._state(epoch, origin + min(consumed, self.size - origin))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed or state.get("size") != self.size:
            raise ValueError(f"not this order's state: {state}")
        self._epoch, self._position, self._pass = state["epoch"], state["position"], None

    def settle(self) -> None:
        current, self._pass = self._pass, None
        if current is not None and not current.finished:
            self._position = current.origin + current.drawn

    # -- what a DataLoader's sampler is

    def __iter__(self) -> Iterator[int]:
        self.settle()
        return self._draw()

    def _draw(self) -> Iterator[int]:
        pass_starting(self)  # the library's pass-start hooks (SamplerCheckpoint, verify) hear this order too
        current = self._pass = _Pass(self._epoch, self._position)
        order = np.random.default_rng([self.seed, current.epoch]).permutation(self.size)
        for index in order[current.origin :].tolist():
            current.drawn += 1
            yield index
        if self._pass is current:  # drawn to its end: the order moves on, as StatefulSampler's does
            current.finished = True
            self._epoch, self._position = current.epoch + 1, 0

    def _state(self, epoch: int, position: int) -> dict[str, Any]:  # position N: the epoch drawn whole
        return {"size": self.size, "seed": self.seed, "epoch": epoch, "position": position}


def _loader(workers: int, seed: int = 7) -> ResumableLoader:
    return ResumableLoader(DataLoader(range(N), sampler=ThirdPartyOrder(N, seed), batch_size=B, num_workers=workers))


def _batches(loader: ResumableLoader, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if count is not None and len(out) == count:
            break
    return out


def _expected_epoch(epoch: int, seed: int = 7) -> list[list[int]]:
    order = np.random.default_rng([seed, epoch]).permutation(N).tolist()
    return [order[i : i + B] for i in range(0, N, B)]


def test_the_order_is_a_resumable_order_and_no_dataset_order() -> None:
    order = ThirdPartyOrder(N)
    assert isinstance(order, ResumableOrder)
    assert not isinstance(order, DatasetOrder)
    assert not isinstance(order, StatefulSampler)
    loader = _loader(0)
    assert loader.sampler.batch_size == B  # taken from the DataLoader, asked once
    assert len(loader) == 6


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 3, 5, 6])
def test_a_third_party_order_resumes_exactly_mid_epoch(workers: int, stop: int) -> None:
    live = _loader(workers)
    first = _batches(live, stop)
    assert first == _expected_epoch(0)[:stop]
    state = live.state_dict()
    assert state["sampler"] == {"size": N, "seed": 7, "epoch": 0, "position": min(stop * B, N)}

    resumed = _loader(workers)
    resumed.load_state_dict(state)
    assert len(resumed) == len(live) == 6 - stop
    rest, live_rest = _batches(resumed), _batches(live)  # the live loader continues from the consumed batches
    assert rest == live_rest == _expected_epoch(0)[stop:]  # after the last batch: nothing more of epoch 0
    assert first + rest == _expected_epoch(0)
    # Twins at every later call: the next epoch, states and lengths alike.
    assert (
        resumed.state_dict()["sampler"]
        == live.state_dict()["sampler"]
        == {"size": N, "seed": 7, "epoch": 1, "position": 0}
    )
    assert len(resumed) == len(live) == 6
    assert _batches(resumed) == _batches(live) == _expected_epoch(1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_between_iter_and_the_first_batch_and_after_set_epoch(workers: int) -> None:
    live = _loader(workers)
    _batches(live, 2)
    iterator = iter(live)  # the broken-off pass is put back at its 2 consumed batches at once
    assert live.state_dict()["sampler"]["position"] == 2 * B
    assert [batch.tolist() for batch in iterator] == _expected_epoch(0)[2:]
    live.set_epoch(3)
    resumed = _loader(workers)
    resumed.load_state_dict(live.state_dict())
    assert _batches(resumed) == _batches(live) == _expected_epoch(3)


def test_the_hooks_hear_a_third_party_order() -> None:
    heard: list[Any] = []
    removers = [
        add_batch_hook(lambda loader, batch, consumed: heard.append(("batch", consumed))),
        add_state_hook(lambda loader, consumed: heard.append(("state", consumed))),
        add_pass_start_hook(lambda order: heard.append(("pass", type(order).__name__))),
    ]
    try:
        loader = _loader(0)
        _batches(loader, 2)
        loader.state_dict()
    finally:
        for remove in removers:
            remove()
    assert heard == [("pass", "ThirdPartyOrder"), ("batch", 1), ("batch", 2), ("state", 2)]


def test_the_loader_reaches_into_no_order_and_the_protocol_is_public() -> None:
    source = Path(inspect.getfile(loader_module)).read_text()
    assert re.findall(r"sampler\._(?!_)\w+", source) == []
    names = {*dir(ResumableOrder), *ResumableOrder.__annotations__} - set(dir(object))
    members = [name for name in names if not name.startswith("_")]
    assert sorted(members) == [
        "batch_size", "epoch", "load_state_dict", "num_replicas", "pass_begun", "remaining_length", "seed",
        "set_epoch", "settle", "state_after", "state_dict",
    ]  # fmt: skip


class ThirdPartyStream(IterableDataset):  # type: ignore[type-arg]
    """A dataset order (``DatasetOrder``): its workers deliver whole batches of the pass ``loader_pass`` begins."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed = size, seed
        self.batch_size: int | None = None  # the loader's is taken
        self._next = (0, 0)  # (epoch, position) the next pass starts from
        self._pass: _Pass | None = None

    @property
    def epoch(self) -> int:
        return self._pass.epoch if self._pass is not None else self._next[0]

    @property
    def num_replicas(self) -> int:
        return 1

    @property
    def pass_begun(self) -> bool:
        return self._pass is not None

    def set_epoch(self, epoch: int) -> None:
        if (self._pass is None and epoch == self._next[0]) or (
            self._pass is not None and not self._pass.finished and epoch == self._pass.epoch
        ):
            return
        self._next, self._pass = (epoch, 0), None

    def __len__(self) -> int:
        return self.size

    def remaining_length(self) -> int:
        if self._pass is not None:
            return self.size - (0 if self._pass.finished else self._pass.origin)  # finished: the next epoch
        return self.size - self._next[1]

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        if consumed_batches is not None:
            return self.state_after(consumed_batches * (self.batch_size or 1))
        if self._pass is not None and not self._pass.finished:
            raise ValueError("a pass is under way and its workers prefetch: pass consumed_batches")
        return self._state(self._pass.epoch + 1, 0) if self._pass is not None else self._state(*self._next)

    def state_after(self, consumed: int) -> dict[str, Any]:
        epoch, origin = self._next if self._pass is None else (self._pass.epoch, self._pass.origin)
        return self._state(epoch, origin + min(consumed, self.size - origin))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed or state.get("size") != self.size:
            raise ValueError(f"not this order's state: {state}")
        self._next, self._pass = (state["epoch"], state["position"]), None

    def settle(self) -> None:
        if self._pass is not None and self._pass.finished:
            self._next, self._pass = (self._pass.epoch + 1, 0), None

    def loader_pass(self, loader: Iterable[Any]) -> Iterator[Any]:
        self.settle()
        pass_starting(self)
        current = self._pass = _Pass(*self._next)  # before iter(loader): the workers' copies hold it
        yield from loader
        current.finished = True

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, origin = self._next if self._pass is None else (self._pass.epoch, self._pass.origin)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.size)[origin:].tolist()
        size = self.batch_size or 1
        for start in range(worker * size, len(order), workers * size):  # whole batches, dealt in turn
            yield from order[start : start + size]

    def _state(self, epoch: int, position: int) -> dict[str, Any]:
        return {"size": self.size, "seed": self.seed, "epoch": epoch, "position": position}


def _stream_loader(workers: int) -> ResumableLoader:
    return ResumableLoader(DataLoader(ThirdPartyStream(N, 7), batch_size=B, num_workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [2, 6])
def test_a_third_party_dataset_order_resumes_exactly_mid_epoch(workers: int, stop: int) -> None:
    live = _stream_loader(workers)
    assert isinstance(live.sampler, DatasetOrder) and live.sampler.batch_size == B
    first = _batches(live, stop)
    assert first == _expected_epoch(0)[:stop]
    state = live.state_dict()
    assert state["sampler"] == {"size": N, "seed": 7, "epoch": 0, "position": min(stop * B, N)}
    resumed = _stream_loader(workers)
    resumed.load_state_dict(state)
    assert len(resumed) == len(live) == 6 - stop
    assert _batches(resumed) == _batches(live) == _expected_epoch(0)[stop:]
    assert resumed.state_dict()["sampler"] == live.state_dict()["sampler"]
    assert len(resumed) == len(live) == 6
    assert _batches(resumed) == _batches(live) == _expected_epoch(1)


class _Tagged(StatefulSampler):
    """A subclass that saves one more field through the extension point, and takes it off on load."""

    def extra_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {"tag": f"{state['epoch']}:{state['position']}"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        if state.pop("tag") != f"{state['epoch']}:{state['position']}":
            raise ValueError("tag: not this state's")
        super().load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_subclass_extends_the_saved_state_through_extra_state_under_the_loader(workers: int) -> None:
    live = ResumableLoader(DataLoader(range(N), sampler=_Tagged(N, seed=3), batch_size=B, num_workers=workers))
    _batches(live, 2)
    state = live.state_dict()
    assert state["sampler"]["tag"] == f"0:{2 * B}" and live.sampler.state_dict(consumed_batches=2) == state["sampler"]
    resumed = ResumableLoader(DataLoader(range(N), sampler=_Tagged(N, seed=3), batch_size=B, num_workers=workers))
    resumed.load_state_dict(state)
    assert _batches(resumed) == _batches(live)


def test_an_extra_field_that_shadows_the_samplers_own_is_refused_naming_it() -> None:
    class Shadowing(StatefulSampler):
        def extra_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
            return {"seed": 1}

    with pytest.raises(TypeError, match=r"^Shadowing.extra_state\(\) returned 'seed', a field of the sampler's own"):
        Shadowing(8).state_dict()
