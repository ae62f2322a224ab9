"""Resuming from a saved state yields exactly the rest of the uninterrupted stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stateful_sampler import StatefulSampler
from tests.helpers import json_round_trip, make_ranks, run_epochs, scaled_examples

TAILS = ["pad", "drop", "uneven", "carry"]
sizes = st.one_of(st.integers(0, 200), st.integers(0, 10**5), st.sampled_from([4**8 + 1, 65537, 2**16 - 1, 10**6]))


def fix_config(size: int, world_size: int, tail: str) -> int:
    return world_size + size if tail == "drop" and 0 < size < world_size else size


@settings(max_examples=scaled_examples(80))
@given(
    size=sizes,
    world_size=st.integers(1, 16),
    batch_size=st.one_of(st.none(), st.integers(1, 32)),
    tail=st.sampled_from(TAILS),
    order=st.sampled_from(["fast", "torch"]),
    seed=st.integers(0, 2**62),
    start_epoch=st.integers(0, 1000),
    stop_fraction=st.floats(0, 1),
    save_offset=st.integers(0, 2),
)
@example(10**6, 3, 8, "carry", "fast", 5, 7, 0.5, 1)
@example(10**6, 16, None, "pad", "torch", 2**62, 0, 0.999, 0)
def test_resume_at_any_position_yields_the_exact_suffix(
    size: int,
    world_size: int,
    batch_size: int | None,
    tail: str,
    order: str,
    seed: int,
    start_epoch: int,
    stop_fraction: float,
    save_offset: int,
) -> None:
    size = fix_config(size, world_size, tail)
    if tail == "carry":
        batch_size = batch_size or 1
    config: dict[str, Any] = {"seed": seed, "tail": tail, "order": order, "batch_size": batch_size}
    epochs = range(start_epoch, start_epoch + 3)
    uninterrupted = run_epochs(make_ranks(size, world_size, **config), epochs)

    # Ranks run in lockstep; stop them all after `drawn` local indices of the saved epoch.
    save_epoch = start_epoch + save_offset
    before = make_ranks(size, world_size, **config)
    for sampler in before:
        sampler.set_epoch(save_epoch)
    local_length = len(before[0])
    drawn = round(stop_fraction * local_length)
    iterators = [iter(sampler) for sampler in before]
    for rank, iterator in enumerate(iterators):
        prefix = [next(iterator) for _ in range(min(drawn, len(before[rank])))]
        assert prefix == uninterrupted[rank][save_epoch - start_epoch][: len(prefix)]
    state = json_round_trip(before[0].state_dict())

    after = make_ranks(size, world_size, **config)
    for rank, sampler in enumerate(after):
        sampler.load_state_dict(state)
        sampler.set_epoch(save_epoch)  # what Lightning does on resume: keeps the restored position
        rest = [list(sampler)] + run_epochs([sampler], range(save_epoch + 1, epochs.stop))[0]
        expected = uninterrupted[rank][save_epoch - start_epoch :]
        skipped = min(drawn, len(expected[0]))
        assert rest == [expected[0][skipped:]] + expected[1:]


@settings(max_examples=scaled_examples(40))
@given(
    size=st.integers(0, 3000),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 16),
    tail=st.sampled_from(TAILS),
    consumed=st.integers(0, 400),
    extra_drawn=st.integers(0, 64),
)
def test_consumed_batches_ignores_what_ran_ahead(
    size: int, world_size: int, batch_size: int, tail: str, consumed: int, extra_drawn: int
) -> None:
    """Training consumed k batches while the loader drew further ahead: the state of k batches,
    resumed over several epochs without set_epoch, continues right after batch k."""
    size = fix_config(size, world_size, tail)
    config: dict[str, Any] = {"seed": 1, "tail": tail, "batch_size": batch_size, "num_replicas": world_size, "rank": 0}
    reference = StatefulSampler(size, **config)
    stream = [i for _ in range(3) for i in reference]
    sampler = StatefulSampler(size, **config)
    iterator = iter(sampler)
    epoch_length = len(sampler)
    consumed = min(consumed, -(-epoch_length // batch_size))
    for _ in range(min(epoch_length, consumed * batch_size + extra_drawn)):
        next(iterator)
    state = json_round_trip(sampler.state_dict(consumed_batches=consumed))
    resumed = StatefulSampler(size, **config)
    resumed.load_state_dict(state)
    rest = [i for _ in range(3) for i in resumed]
    done = min(epoch_length, consumed * batch_size)
    assert rest[: len(stream) - done] == stream[done:]


@settings(max_examples=scaled_examples(50))
@given(
    size=st.integers(0, 5000),
    factors=st.sampled_from([(1, 8, 2, 4), (2, 4, 4, 2), (4, 2, 1, 8), (3, 4, 2, 6), (1, 6, 3, 2), (8, 1, 2, 4)]),
    tail=st.sampled_from(TAILS),
    seed=st.integers(0, 2**32),
    steps=st.integers(0, 100),
)
def test_another_world_size_with_the_same_global_batch_sees_the_same_global_batches(
    size: int, factors: tuple[int, int, int, int], tail: str, seed: int, steps: int
) -> None:
    """Saved with W ranks of batch B at a step boundary, resumed with W' ranks of batch B' where
    B*W = B'*W': every remaining global batch holds exactly the records it held before."""
    old_world, old_batch, new_world, new_batch = factors
    size = fix_config(size, max(old_world, new_world), tail)

    def global_batches(samplers: list[StatefulSampler], batch: int) -> list[list[int]]:
        """Each step's records over all ranks, padding left out (how much padding a tail needs
        depends on W; which records sit at which global positions does not)."""
        streams = [[key.index for key in s if not key.is_padding] for s in samplers]
        steps_left = max(-(-len(stream) // batch) for stream in streams)
        return [sorted(i for stream in streams for i in stream[k * batch : (k + 1) * batch]) for k in range(steps_left)]

    config: dict[str, Any] = {"seed": seed, "tail": tail, "yield_keys": True}
    reference = global_batches(make_ranks(size, old_world, batch_size=old_batch, **config), old_batch)
    steps = min(steps, len(reference))
    before = make_ranks(size, old_world, batch_size=old_batch, **config)
    for sampler in before:
        iterator = iter(sampler)
        for _ in range(min(steps * old_batch, len(sampler))):
            next(iterator)
    state = json_round_trip(before[0].state_dict())
    assert state["position"] == min(steps * old_batch * old_world, before[0].layout().length)
    after = make_ranks(size, new_world, batch_size=new_batch, **config)
    for sampler in after:
        sampler.load_state_dict(state)
    resumed = global_batches(after, new_batch)
    if tail == "drop" and old_world != new_world:
        # floor(N/W)*W depends on W: only the last step may differ, by the records cut off.
        common = min(len(resumed), len(reference) - steps)
        assert resumed[: common - 1] == reference[steps : steps + common - 1]
        assert len(resumed) - (len(reference) - steps) in (-1, 0, 1)
    else:
        assert resumed == reference[steps:]


@pytest.mark.slow  # a new process with 2 DataLoader workers
def test_resume_in_a_new_process_with_two_workers_across_an_epoch_boundary(tmp_path: Path) -> None:
    """A process trains k steps with 2 DataLoader workers and saves what it consumed; a new
    process resumes from that state with 2 workers; together they equal an uninterrupted run."""
    script = Path(__file__).with_name("plain_loop_script.py")
    uninterrupted = tmp_path / "uninterrupted.json"
    first, second, state = tmp_path / "first.json", tmp_path / "second.json", tmp_path / "state.json"
    run = lambda *args: subprocess.run([sys.executable, str(script), *map(str, args)], check=True, timeout=300)
    run("--record", uninterrupted)
    run("--record", first, "--stop-after", 11, "--save", state)  # 11 steps: past epoch 0's 7 batches
    run("--record", second, "--load", state)
    whole = json.loads(uninterrupted.read_text())
    assert len(whole) == 21
    assert json.loads(first.read_text()) + json.loads(second.read_text()) == whole
    assert json.loads(state.read_text())["epoch"] == 1


class CountingSampler(StatefulSampler):
    """Counts what it yields, to prove a resumed loader does not fast-forward through it."""

    yielded = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for item in super().__iter__():
            CountingSampler.yielded += 1
            yield item


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly_without_fast_forwarding(num_workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    size, batch, epochs = 50, 4, 3

    def make() -> tuple[CountingSampler, StatefulDataLoader]:
        sampler = CountingSampler(size, seed=4, batch_size=batch)
        return sampler, StatefulDataLoader(
            torch.arange(size), sampler=sampler, batch_size=batch, num_workers=num_workers
        )

    def run(sampler: CountingSampler, loader: StatefulDataLoader, start: int, stop_after: int | None = None):
        seen: list[list[int]] = []
        for epoch in range(start, epochs):
            sampler.set_epoch(epoch)
            for batch_tensor in loader:
                seen.append(batch_tensor.tolist())
                if len(seen) == stop_after:
                    return seen, loader.state_dict()
        return seen, None

    whole, _ = run(*make(), 0)
    sampler, loader = make()
    head, saved = run(sampler, loader, 0, stop_after=17)  # epoch 1, batch 4 (13 batches per epoch)
    sampler, loader = make()
    loader.load_state_dict(saved)
    CountingSampler.yielded = 0
    tail_batches, _ = run(sampler, loader, 1)
    assert head + tail_batches == whole
    assert CountingSampler.yielded == sum(len(b) for b in tail_batches)  # nothing replayed or skipped
