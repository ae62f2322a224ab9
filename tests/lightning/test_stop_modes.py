"""Issue 9, item 4 and "a Lightning stop-mode matrix": every way a fit can stop mid-way, with 0 and
2 workers, on a ``DataLoader`` and on torchdata's ``StatefulDataLoader``, resumed by a new
``Trainer``, trains on exactly the batches of one uninterrupted fit, under the same epoch numbers,
and ends with bitwise the same weights. The uninterrupted fits are shared across the matrix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.lightning.lightning_harness import RecordingModel, Setup, fit
from tests.lightning.stop_modes import STOP_MODES, STOP_SETUP

LOADERS = {"DataLoader": False, "StatefulDataLoader": True}


def matrix() -> list[object]:
    return [
        pytest.param(
            STOP_SETUP.with_(num_workers=workers, stateful_loader=stateful),
            id=f"{name}-workers{workers}",
            marks=[pytest.mark.slow] if workers else [],
        )
        for name, stateful in LOADERS.items()
        for workers in (0, 2)
    ]


@pytest.fixture(scope="module")
def uninterrupted(one_thread: None) -> Callable[[Setup], RecordingModel]:
    """The uninterrupted fit of a setup, run once per module."""
    runs: dict[Setup, RecordingModel] = {}

    def run(setup: Setup) -> RecordingModel:
        if setup not in runs:
            runs[setup] = fit(setup)
        return runs[setup]

    return run


def assert_resumed_like(resumed: RecordingModel, reference: RecordingModel) -> None:
    assert resumed.record == reference.record
    assert len(reference.record) == 18
    # the steps the resumed Trainer ran carry the epoch numbers of the same steps uninterrupted
    assert resumed.epochs == reference.epochs[len(reference.epochs) - len(resumed.epochs) :]
    assert torch.equal(resumed.layer.weight, reference.layer.weight)
    assert torch.equal(resumed.layer.bias, reference.layer.bias)


@pytest.mark.parametrize("mode", list(STOP_MODES))
@pytest.mark.parametrize("setup", matrix())
def test_a_fit_stopped_any_way_resumes_to_the_uninterrupted_batches_epochs_and_weights(
    mode: str, setup: Setup, uninterrupted: Callable[[Setup], RecordingModel], tmp_path: Path
) -> None:
    assert_resumed_like(STOP_MODES[mode](setup, tmp_path), uninterrupted(setup))
