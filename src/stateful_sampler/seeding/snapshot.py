"""Saving and restoring the process's RNG states with the data, so that a model's dropout resumes bitwise.

A resumed run that sees exactly the same batches still diverges if its model draws from torch's RNG
(dropout, random masking) and that RNG starts from a different state: the data resumed, the model's
randomness did not. ``capture_rng_states`` and ``restore_rng_states`` carry torch's CPU RNG, the CUDA
RNGs (where CUDA is initialised), NumPy's legacy global RNG and Python's ``random``.

The captured dict holds only ``dict``, ``list``, ``str``, ``int``, ``float`` and ``None``: it survives
``torch.save``/``torch.load(weights_only=True)``, JSON, and any framework checkpoint that pickles plain
objects (Fabric, Accelerate, DCP). Its layout (version 1)::

    {"version": 1,
     "torch": [5056 ints 0..255],            # torch.get_rng_state() as bytes
     "cuda": [[ints 0..255], ...],           # one per device; [] when CUDA was not initialised
     "numpy": {"bit_generator": "MT19937", "state": {"key": [624 ints], "pos": int},
               "has_gauss": int, "gauss": float},
     "random": {"version": 3, "internal": [625 ints], "gauss_next": float | None}}

These RNGs belong to the process, so each rank (and each process) saves and restores its own: under DCP,
store the dict under a per-rank key, since DCP keeps one copy of a key it believes replicated.

Example::

    states = capture_rng_states()
    ...                     # training draws
    restore_rng_states(states)  # the next draws repeat those after the capture
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from stateful_sampler.errors import IncompatibleStateError

SNAPSHOT_VERSION = 1
_FIELDS = ("version", "torch", "cuda", "numpy", "random")


def capture_rng_states() -> dict[str, Any]:
    """The process's RNG states now, as plain Python values (see the module docstring for the layout)."""
    cuda = [_byte_list(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else []
    numpy_state = np.random.get_state(legacy=False)
    version, internal, gauss_next = random.getstate()
    return {
        "version": SNAPSHOT_VERSION,
        "torch": _byte_list(torch.get_rng_state()),
        "cuda": cuda,
        "numpy": _plain(numpy_state),
        "random": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def restore_rng_states(states: Mapping[str, Any]) -> None:
    """Put back the states ``capture_rng_states`` returned. Everything is validated before any RNG is
    touched, so a refused state changes nothing; ``IncompatibleStateError`` names the field."""
    if not isinstance(states, Mapping):
        raise IncompatibleStateError("rng_states", type(states).__name__, "a mapping from capture_rng_states()")
    missing = [f for f in _FIELDS if f not in states]
    if missing:
        raise IncompatibleStateError(missing[0], "<missing>", "present", "not a capture_rng_states() dict")
    if states["version"] != SNAPSHOT_VERSION:
        raise IncompatibleStateError("version", states["version"], SNAPSHOT_VERSION, "unknown RNG snapshot version")
    torch_state = _bytes_tensor("torch", states["torch"], torch.get_rng_state().numel())
    cuda_states = _cuda_states(states["cuda"])
    numpy_state = _numpy_state(states["numpy"])
    python_state = _python_state(states["random"])
    torch.set_rng_state(torch_state)
    if cuda_states:
        torch.cuda.set_rng_state_all(cuda_states)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def _byte_list(state: torch.Tensor) -> list[int]:
    return state.to(torch.uint8).tolist()  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """NumPy arrays and scalars inside a state, as lists and ints."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _int_list(field: str, value: Any, length: int | None, low: int, high: int) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise IncompatibleStateError(field, type(value).__name__, "a list of ints")
    if length is not None and len(value) != length:
        raise IncompatibleStateError(field, f"{len(value)} values", f"{length} values")
    if value and (min(value) < low or max(value) > high):
        raise IncompatibleStateError(field, f"values in [{min(value)}, {max(value)}]", f"values in [{low}, {high}]")
    return list(value)


def _bytes_tensor(field: str, value: Any, length: int | None) -> torch.Tensor:
    return torch.tensor(_int_list(field, value, length, 0, 255), dtype=torch.uint8)


def _cuda_states(value: Any) -> list[torch.Tensor]:
    if not isinstance(value, (list, tuple)):
        raise IncompatibleStateError("cuda", type(value).__name__, "a list of per-device states")
    if not value:
        return []
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(value) != available:
        raise IncompatibleStateError(
            "cuda", f"{len(value)} devices", f"{available} devices", "the CUDA devices changed since the capture"
        )
    return [_bytes_tensor(f"cuda[{i}]", s, None) for i, s in enumerate(value)]


def _numpy_state(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not {"bit_generator", "state", "has_gauss", "gauss"} <= set(value):
        raise IncompatibleStateError("numpy", type(value).__name__, "np.random.get_state(legacy=False) as plain values")
    current = np.random.get_state(legacy=False)
    if value["bit_generator"] != current["bit_generator"]:
        raise IncompatibleStateError("numpy.bit_generator", value["bit_generator"], current["bit_generator"])
    inner = value["state"]
    if not isinstance(inner, Mapping) or set(inner) != set(current["state"]):
        raise IncompatibleStateError("numpy.state", inner, f"a mapping with keys {sorted(current['state'])}")
    state = dict(inner)
    if isinstance(current["state"].get("key"), np.ndarray):  # MT19937: 624 words and a position
        key = _int_list("numpy.state.key", inner["key"], current["state"]["key"].size, 0, 2**32 - 1)
        state["key"] = np.asarray(key, dtype=np.uint32)
        if not isinstance(inner["pos"], int) or not 0 <= inner["pos"] <= current["state"]["key"].size:
            raise IncompatibleStateError(
                "numpy.state.pos", inner["pos"], f"an int in [0, {current['state']['key'].size}]"
            )
    if value["has_gauss"] not in (0, 1) or not isinstance(value["gauss"], (int, float)):
        raise IncompatibleStateError("numpy.has_gauss", value["has_gauss"], "0 or 1, with a float gauss")
    return {
        "bit_generator": value["bit_generator"],
        "state": state,
        "has_gauss": int(value["has_gauss"]),
        "gauss": float(value["gauss"]),
    }


def _python_state(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, Mapping) or set(value) != {"version", "internal", "gauss_next"}:
        raise IncompatibleStateError("random", type(value).__name__, "{'version', 'internal', 'gauss_next'}")
    current_version = random.getstate()[0]
    if value["version"] != current_version:
        raise IncompatibleStateError("random.version", value["version"], current_version)
    internal = _int_list("random.internal", value["internal"], 625, 0, 2**32 - 1)
    gauss_next = value["gauss_next"]
    if gauss_next is not None and not isinstance(gauss_next, float):
        raise IncompatibleStateError("random.gauss_next", gauss_next, "a float or None")
    return (value["version"], tuple(internal), gauss_next)
