"""capture_rng_states / restore_rng_states: the process's RNGs repeat their draws after a restore,
through torch.save/torch.load(weights_only=True), and a bad state is refused before anything changes.
The snapshot is compact (bytes deflated, as base64: issue 25, item 20), and 0.2.0's lists of ints restore."""

from __future__ import annotations

import base64
import copy
import io
import json
import random
import zlib
from typing import Any

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


def version_1_states() -> dict[str, Any]:
    """What release 0.2.0's capture_rng_states returned: every run of bytes or words a list of ints."""
    numpy_state = np.random.get_state(legacy=False)
    version, internal, gauss_next = random.getstate()
    return {
        "version": 1,
        "torch": torch.get_rng_state().tolist(),
        "cuda": [],
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "state": {"key": numpy_state["state"]["key"].tolist(), "pos": int(numpy_state["state"]["pos"])},
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "random": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def test_the_snapshot_is_about_10_kb_of_json_a_third_of_0_2_0_s() -> None:
    draws()
    compact, lists = len(json.dumps(capture_rng_states())), len(json.dumps(version_1_states()))
    assert compact <= 10_600 and lists > 3 * compact, (compact, lists)


def test_a_0_2_0_snapshot_still_restores() -> None:
    torch.manual_seed(4), np.random.seed(5), random.seed(6)
    draws()
    states = version_1_states()
    expected = draws()
    restore_rng_states(json.loads(json.dumps(states)))
    assert draws() == expected


def test_dropout_repeats_after_restore() -> None:
    dropout = torch.nn.Dropout(0.5)
    states = capture_rng_states()
    first = dropout(torch.ones(64))
    restore_rng_states(states)
    assert torch.equal(dropout(torch.ones(64)), first)


def packed(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data)).decode("ascii")


@pytest.mark.parametrize(
    ("capture", "edit", "field"),
    [
        (capture_rng_states, lambda s: s.pop("torch"), "torch"),
        (capture_rng_states, lambda s: s.__setitem__("version", 3), "version"),
        (capture_rng_states, lambda s: s.__setitem__("torch", packed(bytes(5055))), "torch"),
        (capture_rng_states, lambda s: s.__setitem__("torch", packed(bytes(10**7))), "torch"),  # inflates no further
        (capture_rng_states, lambda s: s.__setitem__("torch", s["torch"][:-8]), "torch"),
        (capture_rng_states, lambda s: s.__setitem__("torch", "not base64!"), "torch"),
        (capture_rng_states, lambda s: s.__setitem__("torch", list(range(5056))), "torch"),
        (capture_rng_states, lambda s: s.__setitem__("cuda", ["AAAA"]), "cuda"),
        (capture_rng_states, lambda s: s["numpy"].__setitem__("bit_generator", "PCG64"), "numpy.bit_generator"),
        (capture_rng_states, lambda s: s["numpy"]["state"].__setitem__("key", packed(bytes(8))), "numpy.state.key"),
        (capture_rng_states, lambda s: s["random"].__setitem__("internal", packed(bytes(2496))), "random.internal"),
        (version_1_states, lambda s: s.__setitem__("torch", s["torch"][:-1]), "torch"),
        (version_1_states, lambda s: s["torch"].__setitem__(0, 256), "torch"),
        (version_1_states, lambda s: s.__setitem__("cuda", [[0, 1]]), "cuda"),
        (version_1_states, lambda s: s["numpy"]["state"].__setitem__("key", [1, 2]), "numpy.state.key"),
        (version_1_states, lambda s: s["random"].__setitem__("internal", [0] * 3), "random.internal"),
    ],
)
def test_bad_state_names_the_field_and_changes_nothing(capture, edit, field) -> None:  # type: ignore[no-untyped-def]
    states = capture()
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
