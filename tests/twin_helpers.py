"""Shared pieces of the twin tests: sampler configurations over every strategy and tail, and
outcomes that compare a value or a refusal the same way.

A twin test drives a live object and, after every save, a twin restored fresh from its
``state_dict()``; every call goes to both and what they yield and report must be equal
(issue 17, docs/core.md "Epoch ends and early exits").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st

from stateful_sampler import (
    Curriculum,
    Grouped,
    LengthGrouped,
    Mixture,
    StatefulSampler,
    Strategy,
    Stratified,
    Weighted,
)
from tests.helpers import scaled_examples

TAILS = ("pad", "drop", "uneven", "carry")
KINDS = ("uniform", "weighted", "stratified", "grouped", "length_grouped", "curriculum", "mixture")
# set_epoch(any): mostly the next few epochs, sometimes a far one, sometimes one that is refused
EPOCHS = st.one_of(st.integers(0, 5), st.sampled_from([2**20, 2**40, -1, 2**62]))


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that builds one rank's sampler; ``strategy`` is rebuilt for every sampler, so a
    twin shares no object with the live sampler it was restored from."""

    size: int
    seed: int
    tail: str
    world_size: int
    batch_size: int | None  # the sampler's own (None: a ResumableLoader takes the DataLoader's)
    kind: str
    loader_batch: int  # the DataLoader's batch size, in the loader twins
    options: dict[str, Any] = field(default_factory=dict)  # StatefulSampler keyword arguments
    strategy_args: tuple[Any, ...] = ()
    strategy_kwargs: dict[str, Any] = field(default_factory=dict)

    def strategy(self) -> Strategy | None:
        maker = _MAKERS[self.kind]
        return None if maker is None else maker(*self.strategy_args, **self.strategy_kwargs)

    def sampler(self, rank: int) -> StatefulSampler:
        return StatefulSampler(
            self.size,
            seed=self.seed,
            num_replicas=self.world_size,
            rank=rank,
            tail=self.tail,
            batch_size=self.batch_size,
            strategy=self.strategy(),
            **self.options,
        )

    def ranks(self) -> list[StatefulSampler]:
        return [self.sampler(rank) for rank in range(self.world_size)]


_MAKERS: dict[str, Callable[..., Strategy] | None] = {
    "uniform": None,
    "weighted": Weighted,
    "stratified": Stratified,
    "grouped": Grouped,
    "length_grouped": LengthGrouped,
    "curriculum": Curriculum,
    "mixture": Mixture,
}


@st.composite
def sampler_configs(draw: Any, kind: str, max_size: int = 13, max_world: int = 4, keys: bool = True) -> SamplerConfig:
    """A small sampler of strategy ``kind`` on 1..``max_world`` ranks under any tail (``keys``: it may
    yield ``SampleKey`` s)."""
    world_size = draw(st.integers(1, max_world))
    tail = draw(st.sampled_from(TAILS))
    batch = draw(st.integers(1, 3))
    batch_size = batch if tail == "carry" else draw(st.sampled_from([None, batch]))
    seed = draw(st.integers(0, 2**63 - 1))
    options: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if kind == "mixture":
        sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        size = sum(sizes)
        weights = draw(st.lists(st.integers(0, 3), min_size=len(sizes), max_size=len(sizes)).filter(any))
        kwargs["num_samples"] = draw(st.integers(1, 12))
        if draw(st.booleans()):
            kwargs["schedule"] = {
                draw(st.integers(1, 3)): draw(
                    st.lists(st.integers(0, 3), min_size=len(sizes), max_size=len(sizes)).filter(any)
                )
            }
        args = (sizes, weights)
    else:
        size = draw(st.integers(0 if kind == "uniform" else 1, max_size))
        ids = st.lists(st.integers(0, 3), min_size=size, max_size=size)
        if kind == "uniform":
            options = {"shuffle": draw(st.booleans()), "order": draw(st.sampled_from(["fast", "torch"])),
                       "yield_keys": keys and draw(st.booleans())}  # fmt: skip
        elif kind == "weighted":
            weights = draw(ids.filter(any))
            replacement = draw(st.booleans())
            most = size + 4 if replacement else sum(1 for w in weights if w)
            kwargs = {"replacement": replacement, "num_samples": draw(st.one_of(st.none(), st.integers(1, most)))}
            args = (weights,)
        elif kind == "stratified":
            mode = draw(st.sampled_from(["proportional", "balanced"]))
            kwargs = {"mode": mode}
            if mode == "balanced":
                kwargs["num_samples"] = draw(st.one_of(st.none(), st.integers(1, 2 * size + 2)))
            args = (draw(ids),)
        elif kind == "grouped":
            groups = draw(ids)
            lanes = draw(st.integers(1, max(1, min(world_size, len(set(groups))))))
            kwargs = {"shuffle_within": draw(st.booleans()), "lanes": lanes}
            args = (groups,)
        elif kind == "length_grouped":
            kwargs = {"batch_size": (batch_size or 1) * world_size, "megabatch": draw(st.integers(1, 3)),
                      "longest_first": draw(st.booleans())}  # fmt: skip
            args = (draw(st.lists(st.integers(0, 9), min_size=size, max_size=size)),)
        elif kind == "curriculum":
            bands = draw(ids)
            count = len(set(bands))
            if tail != "carry" and draw(st.booleans()):
                kwargs["schedule"] = draw(st.lists(st.integers(1, count), min_size=1, max_size=3))
            args = (bands,)
    return SamplerConfig(size, seed, tail, world_size, batch_size, kind, batch, options, args, kwargs)


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """("ok", value) or ("raised", type, message): a refusal compares as equal as a value does."""
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - the twin must refuse exactly what the live one refuses
        return ("raised", type(error).__name__, str(error))


def take(iterator: Iterator[Any], count: int) -> tuple[list[Any], bool, tuple[Any, ...] | None]:
    """Up to ``count`` items, whether the iterator stopped, and the error it raised if any."""
    items: list[Any] = []
    try:
        for _ in range(count):
            items.append(next(iterator))
    except StopIteration:
        return items, True, None
    except Exception as error:  # noqa: BLE001
        return items, True, (type(error).__name__, str(error))
    return items, False, None


def json_round_trip(state: Any) -> Any:
    return json.loads(json.dumps(state))


Machine = TypeVar("Machine", bound=type)


def worker_variant(base: Machine, workers: int, examples: int, worker_examples: int, max_world: int) -> Machine:
    """``base`` driven through DataLoaders of ``workers`` workers. A pass with workers starts
    processes, so it runs fewer and shorter examples, on one rank."""
    machine = type(f"{base.__name__}_{workers}_workers", (base,),
                   {"workers": workers, "max_world": max_world if workers == 0 else 1})  # fmt: skip
    runs, steps = (examples, 20) if workers == 0 else (worker_examples, 12)
    machine.TestCase.settings = settings(max_examples=scaled_examples(runs), stateful_step_count=steps, deadline=None)  # type: ignore[attr-defined]
    return machine  # type: ignore[return-value]
