"""``SamplerCheckpoint(restore_rng_states=...)``: what the checkpoint holds, and old checkpoints (issue 17, item 8).
That a model with dropout resumes bitwise is the stop-mode matrix (test_stop_modes.py, STOP_SETUP has dropout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stateful_sampler.lightning.callback import _SavedPosition
from tests.lightning.lightning_harness import RecordingModel, SamplerCheckpoint, SaveAt, Setup, make_trainer


def saved_entry(tmp_path: Path, callback: SamplerCheckpoint) -> dict:
    setup = Setup(callback=False, dropout=0.5)
    save = SaveAt(tmp_path, after_batches=(3,))
    make_trainer(setup, [save, callback]).fit(RecordingModel(setup))
    return torch.load(save.saved["batch3"], weights_only=True)["callbacks"]["SamplerCheckpoint"]


def test_the_checkpoint_holds_one_rng_snapshot_per_rank_by_default(tmp_path: Path) -> None:
    entry = saved_entry(tmp_path, SamplerCheckpoint())
    assert entry["version"] == 3
    [snapshot] = entry["rng_states"]
    assert sorted(snapshot) == ["cuda", "numpy", "random", "torch", "version"]


def test_restore_rng_states_false_saves_none_and_leaves_the_rngs_to_the_user(tmp_path: Path) -> None:
    assert saved_entry(tmp_path, SamplerCheckpoint(restore_rng_states=False))["rng_states"] is None


def test_a_version_2_checkpoint_without_rng_states_still_loads(tmp_path: Path) -> None:
    entry = saved_entry(tmp_path, SamplerCheckpoint())
    old = {key: value for key, value in entry.items() if key != "rng_states"} | {"version": 2}
    assert _SavedPosition.from_dict(old).rng_states is None


def test_restore_rng_states_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        SamplerCheckpoint(False)  # type: ignore[misc]
