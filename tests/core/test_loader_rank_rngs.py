"""ResumableLoader's RNG states by rank (issue 25, items 7 and 20): the layout and its size, each rank's own
restored at the world size it was saved at only (a warning elsewhere), 0.2.0's states, and malformed ones.
The real 2-process run is tests/core/test_loader_rng_ddp.py."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from stateful_sampler import IncompatibleStateError, ResumableLoader, StatefulSampler
from stateful_sampler.seeding.snapshot import capture_rng_states
from tests.seeding.test_core_snapshot import version_1_states


def make_loader(size: int = 20, batch: int = 4) -> ResumableLoader:
    return ResumableLoader(DataLoader(range(size), sampler=StatefulSampler(size, seed=1), batch_size=batch))


def after_one_batch() -> tuple[ResumableLoader, dict[str, Any]]:
    loader = make_loader()
    next(iter(loader))
    return loader, loader.state_dict()


def test_the_state_keeps_this_process_s_rng_states_under_its_rank_and_is_small() -> None:
    _, state = after_one_batch()
    assert state["version"] == 3 and set(state["rng_states"]) == {"world_size", "ranks"}
    assert state["rng_states"]["world_size"] == 1 and list(state["rng_states"]["ranks"]) == ["0"]
    sizes = {
        "sampler": len(json.dumps(state["sampler"])),
        "loader, 1 rank": len(json.dumps(state)),
        "loader, 8 ranks": len(json.dumps({**state, "rng_states": {"world_size": 8, "ranks": {
            str(rank): capture_rng_states() for rank in range(8)}}})),  # what every_rank=True gathers on 8 ranks
    }  # fmt: skip
    assert sizes["sampler"] < 400 and sizes["loader, 1 rank"] < 11_000 and sizes["loader, 8 ranks"] < 85_000, sizes
    assert len(json.dumps(make_loader(batch=4).state_dict(every_rank=True))) == sizes["loader, 1 rank"]  # no group


def test_the_rng_states_are_restored_with_the_position() -> None:
    _, state = after_one_batch()
    expected = torch.rand(4)
    resumed = make_loader()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert torch.equal(torch.rand(4), expected) and len(resumed) == 4


def test_at_another_world_size_the_position_alone_is_restored_with_a_warning() -> None:
    _, state = after_one_batch()
    saved = {**state, "rng_states": {"world_size": 2, "ranks": {"0": capture_rng_states(), "1": capture_rng_states()}}}
    torch.rand(3)
    expected = torch.get_rng_state()
    resumed = make_loader()
    with pytest.warns(UserWarning, match=r"RNG states saved at world size 2 are not restored at world size 1: the "
                                         r"data resumes exactly"):  # fmt: skip
        resumed.load_state_dict(saved)
    assert torch.equal(torch.get_rng_state(), expected) and len(resumed) == 4


def test_a_state_without_this_rank_s_rng_states_restores_the_position_and_names_the_fix() -> None:
    _, state = after_one_batch()
    saved = {**state, "rng_states": {"world_size": 1, "ranks": {}}}
    resumed = make_loader()
    with pytest.warns(
        UserWarning, match=r"no RNG states for rank 0 \(ranks saved: none\).*state_dict\(every_rank=True\)"
    ):
        resumed.load_state_dict(saved)
    assert len(resumed) == 4


def test_0_2_0_states_still_load() -> None:
    """Loader state version 2: one process's snapshot (rank 0's at 1 rank), or the Fabric plug-in's list."""
    _, state = after_one_batch()
    for as_saved in (lambda states: states, lambda states: {"every_rank": [states]}):
        rng_states = as_saved(version_1_states())
        expected = torch.rand(4)
        old = {"version": 2, "sampler": state["sampler"], "rng_states": json.loads(json.dumps(rng_states))}
        resumed = make_loader()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed.load_state_dict(old)
        assert torch.equal(torch.rand(4), expected) and len(resumed) == 4


def test_a_0_2_0_snapshot_of_one_process_of_several_names_no_rank_and_restores_the_position_only() -> None:
    sampler = StatefulSampler(20, seed=1, num_replicas=2, rank=0, batch_size=4)
    old = {"version": 2, "sampler": sampler.state_dict(consumed_batches=1), "rng_states": version_1_states()}
    loader = ResumableLoader(DataLoader(range(20), sampler=StatefulSampler(20, seed=1), batch_size=4))
    with pytest.warns(UserWarning, match=r"RNG states saved at world size 2 are not restored at world size 1"):
        loader.load_state_dict(old)


@pytest.mark.parametrize(
    ("rng_states", "field"),
    [
        ([1], "rng_states"),
        ({"world_size": 1}, "rng_states"),
        ({"world_size": 0, "ranks": {}}, "rng_states.world_size"),
        ({"world_size": 1, "ranks": []}, "rng_states.ranks"),
        ({"world_size": 1, "ranks": {"1": {}}}, "rng_states.ranks"),
        ({"world_size": 2, "ranks": {"01": {}}}, "rng_states.ranks"),
        ({"world_size": 1, "ranks": {"0": 5}}, "rng_states.ranks['0']"),
        ({"world_size": 1, "ranks": {"0": {"version": 2}}}, "torch"),
    ],
)
def test_malformed_rng_states_are_refused_naming_the_field_and_change_nothing(rng_states: Any, field: str) -> None:
    _, state = after_one_batch()
    loader = make_loader()
    before = (loader.state_dict()["sampler"], torch.get_rng_state())
    with pytest.raises(IncompatibleStateError) as refused:
        loader.load_state_dict({**state, "rng_states": rng_states})
    assert refused.value.field == field
    assert loader.state_dict()["sampler"] == before[0] and torch.equal(torch.get_rng_state(), before[1])


def test_every_rank_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"every_rank"):
        make_loader().state_dict(every_rank="yes")  # type: ignore[arg-type]
