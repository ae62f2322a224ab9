"""Saving and restoring the process's RNG states with the data, so that a model's dropout resumes bitwise.

A resumed run that sees exactly the same batches still diverges if its model draws from torch's RNG
(dropout, random masking) and that RNG starts from a different state: the data resumed, the model's
randomness did not. ``capture_rng_states`` and ``restore_rng_states`` carry torch's CPU RNG, the CUDA
RNGs (where CUDA is initialised), NumPy's legacy global RNG and Python's ``random``.

The captured dict holds only ``dict``, ``list``, ``str``, ``int``, ``float`` and ``None``: it survives
``torch.save``/``torch.load(weights_only=True)``, JSON, and any framework checkpoint that pickles plain
objects (Fabric, Accelerate, DCP). Each RNG's words are bytes, deflated and base64-encoded, so the dict is
about 10 KB of JSON (three Mersenne Twisters of 2.5 KB each, in base64). Its layout (version 2)::

    {"version": 2,
     "torch": "<base64>",                    # torch.get_rng_state(): 5056 bytes
     "cuda": ["<base64>", ...],              # one per device; [] when CUDA was not initialised
     "numpy": {"bit_generator": "MT19937", "state": {"key": "<base64>", "pos": int},   # 624 uint32, little-endian
               "has_gauss": int, "gauss": float},
     "random": {"version": 3, "internal": "<base64>", "gauss_next": float | None}}     # 625 uint32

Version 1 (release 0.2.0: the same fields, each run of bytes or words a JSON list of ints, 34 KB) still
restores.

These RNGs belong to the process, so each rank (and each process) saves and restores its own: under DCP,
store the dict under a per-rank key, since DCP keeps one copy of a key it believes replicated.

``capture_rank_rng_states`` / ``rank_rng_restorer`` keep them by rank, for a checkpoint that one rank writes
for all (``ResumableLoader``, the Fabric plug-in)::

    {"world_size": 2, "ranks": {"0": <capture_rng_states()>, "1": ...}}

Each rank restores its own, at the world size they were saved at only: at another one no uninterrupted run
had these ranks' randomness, so the data resumes and the RNGs are left as they are (with a warning).

Example::

    states = capture_rng_states()
    ...                     # training draws
    restore_rng_states(states)  # the next draws repeat those after the capture
"""

from __future__ import annotations

import base64
import binascii
import random
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.ranks import process_rank, process_world_size

SNAPSHOT_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # 1: release 0.2.0, bytes and words as lists of ints
_FIELDS = ("version", "torch", "cuda", "numpy", "random")
_WORD = np.dtype("<u4")  # the Mersenne Twister's 32-bit words, little-endian whatever the machine
_TORCH_STRIDE = 8  # torch's CPU state: 64-bit slots


def capture_rng_states() -> dict[str, Any]:
    """The process's RNG states now, as plain Python values (see the module docstring for the layout)."""
    cuda = [_pack(_bytes_of(s)) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else []
    numpy_state = _plain(np.random.get_state(legacy=False))
    key = numpy_state["state"].get("key")
    if isinstance(key, np.ndarray):  # MT19937 (another bit generator's state is a few plain ints)
        numpy_state["state"]["key"] = _pack(key.astype(_WORD).tobytes())
    version, internal, gauss_next = random.getstate()
    return {
        "version": SNAPSHOT_VERSION,
        "torch": _pack(_bytes_of(torch.get_rng_state()), _TORCH_STRIDE),
        "cuda": cuda,
        "numpy": numpy_state,
        "random": {
            "version": version,
            "internal": _pack(np.asarray(internal, _WORD).tobytes()),
            "gauss_next": gauss_next,
        },
    }


def restore_rng_states(states: Mapping[str, Any]) -> None:
    """Put back the states ``capture_rng_states`` returned (this release's or 0.2.0's). Everything is
    validated before any RNG is touched, so a refused state changes nothing; ``IncompatibleStateError``
    names the field."""
    rng_restorer(states)()


def rng_restorer(states: Mapping[str, Any]) -> Callable[[], None]:
    """Validate ``states`` now and return the call that puts them back, for a caller that validates the
    rest of a checkpoint before it changes anything (``ResumableLoader.load_state_dict``)."""
    checked = _Checked.of(states)
    return checked.apply


def capture_rank_rng_states(*, every_rank: bool = False) -> dict[str, Any]:
    """This process's RNG states under its rank in the process group (rank 0 of 1 without one).

    ``every_rank=True`` gathers every rank's to rank 0, whose dict then holds them all (another rank's holds
    its own): a collective, so every rank must call it, as ``fabric.save`` does; called on one rank only it
    would wait for the others. Without it nothing is exchanged, so a call on rank 0 alone never blocks.
    """
    rank, world_size = _process_rank()
    own = capture_rng_states()
    ranks = {str(rank): own}
    if every_rank and world_size > 1:
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(own, gathered, dst=0)
        if gathered is not None:
            ranks = {str(r): states for r, states in enumerate(gathered)}
    return {"world_size": world_size, "ranks": ranks}


def rank_rng_restorer(saved: Any) -> Callable[[], None] | None:
    """Validate this process's RNG states in a ``capture_rank_rng_states`` dict now; the call that puts them
    back, or ``None`` (with a warning, once) where it holds none for this rank at this world size."""
    world_size, ranks = check_rank_rng_states(saved)
    rank, current = _process_rank()
    if world_size != current:
        _warn_once(
            f"RNG states saved at world size {world_size} are not restored at world size {current}: the data "
            f"resumes exactly, the process's RNGs (dropout, ...) go on from their own state, since no uninterrupted "
            f"run had these ranks' randomness"
        )
        return None
    if str(rank) not in ranks:
        saved_ranks = ", ".join(sorted(ranks, key=int)) or "none"
        _warn_once(
            f"the state holds no RNG states for rank {rank} (ranks saved: {saved_ranks}), so only the data resumes "
            f"exactly on this rank: take the state with state_dict(every_rank=True) on every rank (a collective), "
            f"which gives rank 0's copy every rank's RNG states"
        )
        return None
    return rng_restorer(ranks[str(rank)])


def check_rank_rng_states(saved: Any) -> tuple[int, dict[str, Any]]:
    """The world size and the snapshots by rank of a ``capture_rank_rng_states`` dict, its shape checked."""
    if not isinstance(saved, Mapping) or set(saved) != {"world_size", "ranks"}:
        raise IncompatibleStateError("rng_states", _shape(saved), "{'world_size': W, 'ranks': {'0': ..., ...}}")
    world_size, ranks = saved["world_size"], saved["ranks"]
    if type(world_size) is not int or world_size < 1:
        raise IncompatibleStateError("rng_states.world_size", world_size, "an int of at least 1")
    if not isinstance(ranks, Mapping):
        raise IncompatibleStateError("rng_states.ranks", type(ranks).__name__, "a dict of snapshots by rank")
    for key, states in ranks.items():
        if not isinstance(key, str) or not key.isdigit() or int(key) >= world_size or str(int(key)) != key:
            raise IncompatibleStateError("rng_states.ranks", key, f"ranks '0' to '{world_size - 1}'")
        if not isinstance(states, Mapping):
            raise IncompatibleStateError(f"rng_states.ranks[{key!r}]", type(states).__name__, "a snapshot dict")
    return world_size, dict(ranks)


def _process_rank() -> tuple[int, int]:
    return process_rank(), process_world_size()


def _shape(value: Any) -> Any:
    return sorted(value) if isinstance(value, Mapping) else type(value).__name__


def _warn_once(message: str) -> None:
    """Python's default filter shows a warning once per place and text, however many loads there are."""
    warnings.warn(message, UserWarning, stacklevel=4)


@dataclass(frozen=True)
class _Checked:
    """A validated snapshot, ready to put back."""

    torch_state: torch.Tensor
    cuda_states: list[torch.Tensor]
    numpy_state: dict[str, Any]
    python_state: tuple[Any, ...]

    @classmethod
    def of(cls, states: Any) -> _Checked:
        if not isinstance(states, Mapping):
            raise IncompatibleStateError("rng_states", type(states).__name__, "a mapping from capture_rng_states()")
        missing = [f for f in _FIELDS if f not in states]
        if missing:
            raise IncompatibleStateError(missing[0], "<missing>", "present", "not a capture_rng_states() dict")
        version = states["version"]
        if type(version) is not int or version not in _READABLE_VERSIONS:
            raise IncompatibleStateError("version", version, SNAPSHOT_VERSION, "unknown RNG snapshot version")
        packed = version == SNAPSHOT_VERSION
        return cls(
            _bytes_tensor("torch", states["torch"], torch.get_rng_state().numel(), packed, _TORCH_STRIDE),
            _cuda_states(states["cuda"], packed),
            _numpy_state(states["numpy"], packed),
            _python_state(states["random"], packed),
        )

    def apply(self) -> None:
        torch.set_rng_state(self.torch_state)
        if self.cuda_states:
            torch.cuda.set_rng_state_all(self.cuda_states)
        np.random.set_state(self.numpy_state)
        random.setstate(self.python_state)


def _bytes_of(state: torch.Tensor) -> bytes:
    return bytes(state.to(torch.uint8).numpy().tobytes())


def _pack(data: bytes, stride: int = 1) -> str:
    """``data`` deflated, as base64; with ``stride``, its bytes regrouped by their place in each ``stride``-byte
    word first (torch keeps 32-bit words in 64-bit slots: the zero halves then deflate to almost nothing)."""
    if stride > 1 and len(data) % stride == 0:
        data = np.frombuffer(data, np.uint8).reshape(-1, stride).T.tobytes()
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def _unpack(field: str, value: Any, length: int | None, stride: int = 1) -> bytes:
    """The bytes ``_pack`` encoded, refused unless they are exactly ``length`` (a bounded inflate: a
    crafted state cannot make it allocate more)."""
    if not isinstance(value, str):
        raise IncompatibleStateError(field, type(value).__name__, "a base64 str from capture_rng_states()")
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.b64decode(value, validate=True), (length or 1 << 20) + 1)
    except (binascii.Error, ValueError, zlib.error) as error:
        raise IncompatibleStateError(field, f"{value[:16]!r}...", "base64 of deflated bytes", str(error)) from error
    if not inflate.eof or inflate.unconsumed_tail or (length is not None and len(data) != length):
        expected = f"{length} bytes" if length is not None else "at most 1 MiB"
        raise IncompatibleStateError(field, f"{len(data)}{'+' if not inflate.eof else ''} bytes", expected)
    if stride > 1 and len(data) % stride == 0:
        data = np.frombuffer(data, np.uint8).reshape(stride, -1).T.tobytes()
    return data


def _words(field: str, value: Any, length: int, packed: bool) -> list[int]:
    if not packed:
        return _int_list(field, value, length, 0, 2**32 - 1)
    return np.frombuffer(_unpack(field, value, 4 * length), _WORD).tolist()  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """NumPy scalars inside a state as ints and floats (arrays are left to the caller)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
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


def _bytes_tensor(field: str, value: Any, length: int | None, packed: bool, stride: int = 1) -> torch.Tensor:
    if packed:
        return torch.frombuffer(bytearray(_unpack(field, value, length, stride)), dtype=torch.uint8)
    return torch.tensor(_int_list(field, value, length, 0, 255), dtype=torch.uint8)


def _cuda_states(value: Any, packed: bool) -> list[torch.Tensor]:
    if not isinstance(value, (list, tuple)):
        raise IncompatibleStateError("cuda", type(value).__name__, "a list of per-device states")
    if not value:
        return []
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(value) != available:
        raise IncompatibleStateError(
            "cuda", f"{len(value)} devices", f"{available} devices", "the CUDA devices changed since the capture"
        )
    return [_bytes_tensor(f"cuda[{i}]", s, None, packed) for i, s in enumerate(value)]


def _numpy_state(value: Any, packed: bool) -> dict[str, Any]:
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
        size = current["state"]["key"].size
        state["key"] = np.asarray(_words("numpy.state.key", inner["key"], size, packed), dtype=np.uint32)
        if not isinstance(inner["pos"], int) or not 0 <= inner["pos"] <= size:
            raise IncompatibleStateError("numpy.state.pos", inner["pos"], f"an int in [0, {size}]")
    if value["has_gauss"] not in (0, 1) or not isinstance(value["gauss"], (int, float)):
        raise IncompatibleStateError("numpy.has_gauss", value["has_gauss"], "0 or 1, with a float gauss")
    return {
        "bit_generator": value["bit_generator"],
        "state": state,
        "has_gauss": int(value["has_gauss"]),
        "gauss": float(value["gauss"]),
    }


def _python_state(value: Any, packed: bool) -> tuple[Any, ...]:
    if not isinstance(value, Mapping) or set(value) != {"version", "internal", "gauss_next"}:
        raise IncompatibleStateError("random", type(value).__name__, "{'version', 'internal', 'gauss_next'}")
    current_version = random.getstate()[0]
    if value["version"] != current_version:
        raise IncompatibleStateError("random.version", value["version"], current_version)
    internal = _words("random.internal", value["internal"], 625, packed)
    gauss_next = value["gauss_next"]
    if gauss_next is not None and not isinstance(gauss_next, float):
        raise IncompatibleStateError("random.gauss_next", gauss_next, "a float or None")
    return (value["version"], tuple(internal), gauss_next)
