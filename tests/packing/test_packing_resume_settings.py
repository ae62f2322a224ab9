"""A packing resume with other settings is refused naming the setting (``packing.settings.<name>``), and
states saved by 0.2.0 (packing anchor version 1, no settings) and by anchor version 2 (lengths hashed by blake2b)
still load, or are refused saying why."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest

from stateful_sampler import IncompatibleStateError, PackedRows, TokenBudgetBatches

LENGTHS = [(i * 37) % 50 + 1 for i in range(200)]  # the lengths the 0.2.0 states below were saved with

# Saved by stateful-sampler 0.2.0 (packing anchor version 1) at epoch 1 after 7 batches of 4 rows (split and
# whole rows) or 9 token-budget batches: the samplers below, set_epoch(1), state_dict(consumed_batches=...).
V1_STATES = {
    "split": """{"version": 2, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "packed-rows", "strategy_fingerprint": "08f71b6ad09b23c4", "epoch": 1, "position": 28,
        "carry_start": 0, "epoch_end": 80, "world_size": 1, "batch_size": 4, "packing": {"version": 1, "pass": 0,
        "window": 4, "start": 1539, "rows": null, "check": "9168eebb54ac2fd0"}}""",
    "whole": """{"version": 2, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "packed-whole-rows", "strategy_fingerprint": "f76fca253302aa4d", "epoch": 1, "position": 28,
        "carry_start": 0, "epoch_end": 90, "world_size": 1, "batch_size": 4, "packing": {"version": 1, "pass": 1,
        "window": 3, "start": 21, "rows": 90, "check": "7e5d97028862ba52"}}""",
    "budget": """{"version": 2, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "token-budget", "strategy_fingerprint": "159a094290936aeb", "epoch": 1, "position": 9,
        "carry_start": 0, "epoch_end": 38, "world_size": 1, "batch_size": 1, "packing": {"version": 1, "pass": 1,
        "window": 3, "start": 9, "rows": 38, "check": "b630f37daeafb6e5"}}""",
}

# Saved by main a0bd7c6 (packing anchor version 2: settings, lengths hashed by blake2b) the way ``_saved`` saves.
V2_STATES = {
    "split": """{"version": 3, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "packed-rows", "strategy_fingerprint": "08f71b6ad09b23c4", "epoch": 1, "position": 28,
        "carry_start": 0, "epoch_end": 80, "world_size": 1, "batch_size": 4, "strategy_state": null, "packing":
        {"version": 2, "pass": 0, "window": 4, "start": 1539, "rows": null, "settings": {"seq_len": 64,
        "split_records": true, "window": 16, "truncate": false, "lengths": "68557434d0735f9b"},
        "check": "f8a4480213557c4d"}}""",
    "whole": """{"version": 3, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "packed-whole-rows", "strategy_fingerprint": "f76fca253302aa4d", "epoch": 1, "position": 28,
        "carry_start": 0, "epoch_end": 90, "world_size": 1, "batch_size": 4, "strategy_state": null, "packing":
        {"version": 2, "pass": 1, "window": 3, "start": 21, "rows": 90, "settings": {"seq_len": 64,
        "split_records": false, "window": 16, "truncate": false, "lengths": "68557434d0735f9b"},
        "check": "271c98fbaceb8d2c"}}""",
    "budget": """{"version": 3, "size": 200, "seed": 5, "shuffle": true, "tail": "pad", "order": "fast",
        "strategy": "token-budget", "strategy_fingerprint": "159a094290936aeb", "epoch": 1, "position": 9,
        "carry_start": 0, "epoch_end": 38, "world_size": 1, "batch_size": 1, "strategy_state": null, "packing":
        {"version": 2, "pass": 1, "window": 3, "start": 9, "rows": 38, "settings": {"max_tokens": 256,
        "padded": true, "window": 16, "lengths": "68557434d0735f9b"}, "check": "9a2e3fd9c09272d9"}}""",
}


def _make(kind, lengths=LENGTHS, **changed):
    if kind == "budget":
        kwargs = {"max_tokens": 256, "window": 16, "seed": 5, "padded": True, **changed}
        return TokenBudgetBatches(lengths, kwargs.pop("max_tokens"), **kwargs)
    kwargs = {"seq_len": 64, "window": 16, "seed": 5, "batch_size": 4, "split_records": kind == "split", **changed}
    return PackedRows(lengths, kwargs.pop("seq_len"), **kwargs)


STEPS = {"split": 7, "whole": 7, "budget": 9}


def _saved(kind):
    sampler = _make(kind)
    sampler.set_epoch(1)
    items = list(islice(iter(sampler), STEPS[kind] * (sampler.batch_size or 1)))
    return items, json.loads(json.dumps(sampler.state_dict(consumed_batches=STEPS[kind])))


def _plans(sampler):
    return [(list(item), item.key) for item in sampler]


CHANGES = [
    ("split", "seq_len", 48),
    ("split", "window", 17),
    ("split", "split_records", False),
    ("whole", "seq_len", 96),
    ("whole", "window", 8),
    ("whole", "split_records", True),
    ("whole", "truncate", True),
    ("budget", "max_tokens", 300),
    ("budget", "window", 4096),
    ("budget", "padded", False),
]


@pytest.mark.parametrize(("kind", "name", "value"), CHANGES, ids=[f"{k}-{n}" for k, n, _ in CHANGES])
def test_a_resume_with_another_setting_is_refused_naming_it(kind, name, value):
    _, state = _saved(kind)
    saved_value = state["packing"]["settings"][name]
    sampler = _make(kind, **{name: value})
    sampler.set_epoch(2)
    before = sampler.state_dict()
    with pytest.raises(IncompatibleStateError) as caught:
        sampler.load_state_dict(state)
    error = caught.value
    assert (error.field, error.saved, error.current) == (f"packing.settings.{name}", saved_value, value)
    assert f"state field 'packing.settings.{name}': saved {saved_value!r}, expected {value!r}" in str(error)
    assert f"build the sampler with {name}={saved_value!r} to resume it" in str(error)
    assert sampler.state_dict() == before  # nothing lost: the refused state left the sampler as it was
    untouched = _make(kind, **{name: value})
    untouched.set_epoch(2)
    assert _plans(sampler) == _plans(untouched)


@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
def test_a_resume_with_other_lengths_is_refused_naming_the_lengths(kind):
    _, state = _saved(kind)
    changed = list(LENGTHS)
    changed[17] += 1
    for lengths, records in ((changed, 200), (LENGTHS + [5], 201)):
        with pytest.raises(IncompatibleStateError) as caught:
            _make(kind, lengths=lengths).load_state_dict(state)
        assert caught.value.field == "packing.settings.lengths"
        assert f"the lengths are not the saved run's (200 records saved, {records} here" in str(caught.value)
    _make(kind, lengths=np.array(LENGTHS, dtype=np.int32)).load_state_dict(state)  # the same values: the same order


@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
def test_a_state_saved_by_0_2_0_still_resumes_exactly(kind):
    uninterrupted = _make(kind)
    uninterrupted.set_epoch(1)
    whole = _plans(uninterrupted)
    head, state = _saved(kind)
    old = json.loads(V1_STATES[kind])
    # state version 3 added the strategy's slot; anchor version 3 hashes the lengths (so the fingerprint) anew
    new_fields = ("packing", "version", "strategy_state", "strategy_fingerprint")
    assert {k: v for k, v in state.items() if k not in new_fields} == {
        k: v for k, v in old.items() if k not in new_fields
    }
    assert state["strategy_state"] is None and old["version"] == 2
    resumed = _make(kind)
    resumed.load_state_dict(old)
    assert [(list(item), item.key) for item in head] + _plans(resumed) == whole
    assert resumed.state_dict()["packing"]["version"] == 3  # it saves the current version from then on


@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
def test_a_version_2_state_still_resumes_exactly_and_saves_version_3(kind):
    uninterrupted = _make(kind)
    uninterrupted.set_epoch(1)
    head, state = _saved(kind)
    old = json.loads(V2_STATES[kind])
    assert state["packing"]["version"] == 3 and state["packing"]["settings"]["lengths"] != "68557434d0735f9b"
    assert {k: v for k, v in state.items() if k not in ("packing", "strategy_fingerprint")} == {
        k: v for k, v in old.items() if k not in ("packing", "strategy_fingerprint")
    }
    resumed = _make(kind)
    resumed.load_state_dict(old)
    assert [(list(item), item.key) for item in head] + _plans(resumed) == _plans(uninterrupted)
    again, current = _make(kind), _make(kind)
    again.load_state_dict(old)
    current.load_state_dict(state)
    assert again.state_dict() == current.state_dict()  # the fold digest and its fingerprint from then on


@pytest.mark.parametrize("kind", ["split", "whole", "budget"])
def test_a_version_2_state_with_other_lengths_is_refused_naming_the_lengths(kind):
    changed = list(LENGTHS)
    changed[150] += 3
    sampler = _make(kind, lengths=changed)
    before = sampler.state_dict()
    with pytest.raises(IncompatibleStateError) as caught:
        sampler.load_state_dict(json.loads(V2_STATES[kind]))
    assert caught.value.field == "packing.settings.lengths"
    assert (caught.value.saved, caught.value.current) == ("68557434d0735f9b", _legacy_digest(changed))
    assert sampler.state_dict() == before  # the blake2b digest was only in force while loading


def _legacy_digest(lengths):
    from stateful_sampler.order.lengths import legacy_lengths_digest

    return legacy_lengths_digest(np.array(lengths))[:16]


def test_a_version_3_state_relabelled_version_2_is_refused_naming_the_lengths():
    _, state = _saved("whole")
    state["packing"]["version"] = 2
    with pytest.raises(IncompatibleStateError) as caught:
        _make("whole").load_state_dict(state)
    assert caught.value.field == "packing.settings.lengths"


@pytest.mark.parametrize(("kind", "name", "value"), [("split", "seq_len", 48), ("budget", "max_tokens", 300)])
def test_a_0_2_0_state_with_another_setting_is_refused_saying_it_records_none(kind, name, value):
    with pytest.raises(IncompatibleStateError) as caught:
        _make(kind, **{name: value}).load_state_dict(json.loads(V1_STATES[kind]))
    assert caught.value.field == "strategy_fingerprint"
    assert "a version 1 packing state (0.2.0) does not record its settings: one of" in str(caught.value)
    assert name in str(caught.value).rsplit("one of", 1)[1]


def test_the_settings_are_hashed_whatever_order_a_serialiser_keeps_their_keys_in():
    head, state = _saved("whole")
    state["packing"]["settings"] = dict(sorted(state["packing"]["settings"].items(), reverse=True))
    resumed = _make("whole")
    resumed.load_state_dict(state)
    uninterrupted = _make("whole")
    uninterrupted.set_epoch(1)
    assert [(list(item), item.key) for item in head] + _plans(resumed) == _plans(uninterrupted)


@pytest.mark.parametrize(
    ("alter", "field"),
    [
        (lambda packing: packing["settings"].update(seq_len=48), "strategy_fingerprint"),  # edited to match
        (lambda packing: packing["settings"].pop("window"), "packing.settings"),
        (lambda packing: packing["settings"].update(extra=1), "packing.settings"),
        (lambda packing: packing.update(settings=[1, 2]), "packing.settings"),
        (lambda packing: packing["settings"].update(lengths="0" * 16), "packing.settings.lengths"),
        (lambda packing: packing.pop("settings"), "packing"),
        (lambda packing: packing.update(version=4), "packing.version"),
        (lambda packing: packing.update(version=1), "packing"),  # a version 1 anchor has no settings
    ],
)
def test_an_altered_settings_record_is_refused(alter, field):
    _, state = _saved("split")
    alter(state["packing"])
    sampler = _make("split", seq_len=48 if field == "strategy_fingerprint" else 64)
    with pytest.raises(IncompatibleStateError) as caught:
        sampler.load_state_dict(state)
    assert caught.value.field == field
    assert sampler.state_dict()["position"] == 0


def test_the_state_stays_small():
    lengths = np.random.default_rng(0).integers(1, 500, 10_000)
    sampler = PackedRows(lengths, 512, split_records=False, batch_size=8)
    list(islice(iter(sampler), 40))
    assert len(json.dumps(sampler.state_dict(consumed_batches=5))) < 520
