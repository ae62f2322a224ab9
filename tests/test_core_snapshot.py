"""capture_rng_states / restore_rng_states: the process's RNGs repeat their draws after a restore,
through torch.save/torch.load(weights_only=True), and a bad state is refused before anything changes."""

from __future__ import annotations

import copy
import io
import json
import random

import numpy as np
import pytest
import torch

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.seeding.snapshot import capture_rng_states, restore_rng_states


def draws() -> tuple[list[float], list[float], list[float], list[float]]:
    return (
        torch.rand(4).tolist(),
        np.random.random(3).tolist() + [float(np.random.standard_normal())],  # leaves a cached Gaussian
        [random.random() for _ in range(3)],
        [random.gauss(0, 1)],
    )


def test_restore_repeats_every_rng_after_torch_save_and_json() -> None:
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    draws()  # leave NumPy and random mid-stream, with cached Gaussians
    states = capture_rng_states()
    expected = draws()
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded == states
    restore_rng_states(loaded)
    assert draws() == expected
    restore_rng_states(json.loads(json.dumps(states)))
    assert draws() == expected


def test_dropout_repeats_after_restore() -> None:
    dropout = torch.nn.Dropout(0.5)
    states = capture_rng_states()
    first = dropout(torch.ones(64))
    restore_rng_states(states)
    assert torch.equal(dropout(torch.ones(64)), first)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.pop("torch"), "torch"),
        (lambda s: s.__setitem__("version", 2), "version"),
        (lambda s: s.__setitem__("torch", s["torch"][:-1]), "torch"),
        (lambda s: s["torch"].__setitem__(0, 256), "torch"),
        (lambda s: s.__setitem__("cuda", [[0, 1]]), "cuda"),
        (lambda s: s["numpy"].__setitem__("bit_generator", "PCG64"), "numpy.bit_generator"),
        (lambda s: s["numpy"]["state"].__setitem__("key", [1, 2]), "numpy.state.key"),
        (lambda s: s["random"].__setitem__("internal", [0] * 3), "random.internal"),
    ],
)
def test_bad_state_names_the_field_and_changes_nothing(edit, field) -> None:  # type: ignore[no-untyped-def]
    states = capture_rng_states()
    bad = copy.deepcopy(states)
    edit(bad)
    expected = draws()
    restore_rng_states(states)
    with pytest.raises(IncompatibleStateError) as refused:
        restore_rng_states(bad)
    assert refused.value.field == field
    assert draws() == expected  # the refused restore left every RNG where it was


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(IncompatibleStateError, match="rng_states"):
        restore_rng_states([1, 2])  # type: ignore[arg-type]
