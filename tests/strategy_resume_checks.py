"""Resume checks shared by the strategy tests: a loader with workers, a SIGKILLed process, an elastic resume."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.order.strategy import Strategy
from tests.helpers import json_round_trip


def serve(sampler: StatefulSampler, workers: int, batches: int | None = None) -> list[list[int]]:
    """The batches a DataLoader with ``workers`` hands to training, stopping after ``batches``."""
    loader = DataLoader(torch.arange(sampler.size), sampler=sampler, batch_size=sampler.batch_size,
                        num_workers=workers)  # fmt: skip
    seen: list[list[int]] = []
    for step, batch in enumerate(loader, 1):
        seen.append(batch.tolist())
        if step == batches:
            break
    return seen


def loader_resume(
    make: Callable[[], StatefulSampler], workers: int, consumed: int, epoch: int = 0
) -> tuple[list, list]:
    """Epochs ``epoch`` and ``epoch + 1`` uninterrupted, and the same two epochs saved after ``consumed`` batches
    (workers ran ahead) and resumed by a new sampler."""
    reference = make()
    whole = [batch for e in (epoch, epoch + 1) for batch in (reference.set_epoch(e), serve(reference, workers))[1]]
    first = make()
    first.set_epoch(epoch)
    head = serve(first, workers, batches=consumed)
    state = json_round_trip(first.state_dict(consumed_batches=consumed))
    resumed = make()
    resumed.load_state_dict(state)
    rest = serve(resumed, workers)
    resumed.set_epoch(epoch + 1)
    return whole, head + rest + serve(resumed, workers)


def sigkilled_run(
    strategy: str, tmp_path: Path, kill_after: int = 20, workers: tuple[int, int] = (2, 2)
) -> tuple[list[str], list[str]]:
    """The batches of tests/strategy_loop_script.py run whole, and of a run SIGKILLed after step ``kill_after``
    then run again; ``workers`` are the loader workers of the whole run and of the cut one."""
    script = Path(__file__).with_name("strategy_loop_script.py")
    run = lambda *args: subprocess.run([sys.executable, str(script), "--strategy", strategy, *map(str, args)],
                                       timeout=300, check=False)  # fmt: skip
    whole, cut = workers
    assert run("--record", tmp_path / "whole.jsonl", "--state", tmp_path / "whole.json", "--workers", whole
               ).returncode == 0  # fmt: skip
    killed = run("--record", tmp_path / "cut.jsonl", "--state", tmp_path / "cut.json", "--workers", cut,
                 "--kill-after", kill_after)  # fmt: skip
    assert killed.returncode == -9
    assert len((tmp_path / "cut.jsonl").read_text().splitlines()) == kill_after
    assert run("--record", tmp_path / "cut.jsonl", "--state", tmp_path / "cut.json", "--workers", cut).returncode == 0
    return (tmp_path / "whole.jsonl").read_text().splitlines(), (tmp_path / "cut.jsonl").read_text().splitlines()


def elastic_resume(
    strategy: Callable[[], Strategy],
    size: int,
    worlds: tuple[int, int],
    batch_size: int,
    steps: int,
    tail: str,
    epoch: int = 0,
    seed: int = 9,
) -> None:
    """Saved on W ranks after ``steps`` steps of ``epoch``, resumed on W': the new ranks take equal step counts
    and every unconsumed position of the epoch exactly once, in the uninterrupted order; only ``pad`` adds
    repeats."""
    before, after = worlds
    config: dict[str, Any] = {"seed": seed, "tail": tail, "batch_size": batch_size}
    saving = [StatefulSampler(size, strategy=strategy(), num_replicas=before, rank=r, **config) for r in range(before)]
    for sampler in saving:
        sampler.set_epoch(epoch)
    batches = min(steps, -(-len(saving[0]) // batch_size))
    consumed = [list(sampler)[: batches * batch_size] for sampler in saving]
    state = json_round_trip(saving[0].state_dict(consumed_batches=batches))
    resumed = [StatefulSampler(size, strategy=strategy(), num_replicas=after, rank=r, **config) for r in range(after)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    rest = [list(sampler) for sampler in resumed]
    if tail != "uneven":
        assert len({len(part) for part in rest}) == 1  # equal step counts on the new ranks
    length = strategy().pass_length(size, epoch)
    order = strategy().pass_order(size, seed, epoch)(np.arange(length)).tolist()
    position = min(state["position"], length)  # past the pass end under pad: padding only
    assert [consumed[k % before][k // before] for k in range(position)] == order[:position]
    left = order[position:] if state["position"] < state["epoch_end"] else []  # a finished epoch stays finished
    if tail == "drop":
        left = left[: len(left) // after * after]
    assert [rest[k % after][k // after] for k in range(len(left))] == left  # every unconsumed position once
    assert sum(map(len, rest)) - len(left) == (-len(left) % after if tail == "pad" else 0)
