"""Strategies: which record sits at each position of a pass, as a pure function of (seed, pass, position).

A strategy defines every pass's global order and its length, independently of the world size;
tails, rank sharding, elastic resume and state apply to that order the same way for every
strategy (``layout.py``). A pass is what an epoch draws from: epoch e draws pass e, and ``carry``
reads on into the next passes, so it needs passes of one length.

Each strategy answers three questions: how long pass p is, which records sit at a block of its
positions (vectorised, O(block) after a per-pass set-up), and a fingerprint of everything that
shapes the order (its arrays and parameters), so a saved state is refused by a sampler whose
strategy would place other records.
"""

from __future__ import annotations

import hashlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from stateful_sampler.order.permutation import FeistelPermutation

INT64_MAX = (1 << 63) - 1
PassOrder = Callable[[np.ndarray], np.ndarray]  # positions of one pass -> records (int64 arrays)


@dataclass(frozen=True)
class SavedOrder:
    """What a saved state says about the order it was saved from, for ``Strategy.resume_from``: the
    dataset size, the strategy's name and fingerprint, its own slot of the state (``state_at``), and
    the place the saved cursor reads next, as a pass and an offset into it (the pass's end: its length)."""

    size: int
    name: str
    fingerprint: str
    state: Mapping[str, Any] | None
    pass_index: int
    offset: int


class Strategy(ABC):
    """The order of each pass over N records; subclasses are small frozen value objects."""

    name: ClassVar[str]
    passes_vary: bool = False  # pass lengths differ by pass (then ``carry`` is refused); may be per instance
    # its identity is O(parameters), not O(records), its fingerprint costs reprs of nested arrays, and it is built
    # again at every resume: its fingerprints are kept per process, by a digest of the identity (``_kept_hash``)
    keeps_fingerprints: ClassVar[bool] = False

    def check(self, size: int) -> None:
        """Raise ``ValueError`` naming the argument if this strategy cannot order N = ``size`` records."""
        return  # a default hook, not abstract: most strategies can order every N >= 0

    @abstractmethod
    def pass_length(self, size: int, pass_index: int) -> int:
        """How many positions pass ``pass_index`` has."""

    def known_passes(self) -> range:
        """Passes whose lengths are known up front: every later pass is as long as the last of them,
        so a sampler can refuse an impossible epoch at construction, not when it starts."""
        return range(1)

    @abstractmethod
    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        """The records at positions of one pass; set-up cost is paid here, once per pass."""

    def for_sampler(self, batch_size: int | None, world_size: int) -> Strategy:
        """This strategy as the sampler that orders with it uses it: a strategy that needs a value the
        sampler holds (the global batch) takes it here instead of asking the user twice."""
        return self

    def state_at(self, pass_index: int, offset: int, kept_from: int | None = None) -> dict[str, Any] | None:
        """The strategy's own small part of a state saved where the cursor reads ``offset`` of pass
        ``pass_index`` next, which ``resume_from`` gets back (None, the default: nothing beyond the
        fingerprint). ``kept_from``: the state also records what positions [kept_from, offset) of the pass
        hold, so that a strategy continuing it (``resume_from``) keeps them as they were (packed rows splice
        a changed order in at the end of the window in progress, whose rows are planned already)."""
        return None

    def resume_from(self, saved: SavedOrder) -> Strategy | None:
        """The strategy that continues the order a saved state describes, when the strategy decides
        (a mixture changed at a resume); None, the default: only this strategy's own order continues,
        and the sampler refuses a state of another size or fingerprint, as before. A strategy returned
        here is taken as the continuation, whatever the saved size and fingerprint; it raises
        ``IncompatibleStateError`` naming the field for a state it cannot continue."""
        return None

    def counting_floor(self, size: int, pass_index: int) -> int | None:
        """None where pass ``pass_index``'s length is known or quick to find (``pass_length``). Where finding it
        takes a walk (packed rows count every window), that count starts in the background and this returns a
        floor of positions the pass surely has: a sampler reads those while the count runs, so its first rows
        never wait for it."""
        return None

    def saved_pass_length(self, size: int, pass_index: int) -> int:
        """Pass ``pass_index``'s length in the run whose state this strategy continues: its own length, but for a
        continuation (``resume_from``) that changes it from the saved position on (packed rows over a mixture
        changed at a resume count the pass's later rows from the new order). The sampler checks the saved
        cursor against it, and lays out the rest of the pass afresh when it differs."""
        return self.pass_length(size, pass_index)

    def mismatch_hint(self) -> str:
        """Advice appended when a state of this strategy is refused for another size or fingerprint."""
        return ""

    def fingerprint(self) -> str:
        """A short hash of everything that shapes the order, for the saved state's identity; computed
        once (strategies are values, and a state is saved often)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = self.__dict__["_fingerprint"] = self._hash()
        return cached

    def _hash(self) -> str:
        identity = self._identity()
        if self.keeps_fingerprints:
            return _kept_hash(self.name, identity)
        return _hashed(self.name, identity)

    def _identity(self) -> tuple[Any, ...]:
        return ()


# NumPy's default print options, but arrays in full: a fingerprint's reprs must not follow the user's options (a
# precision of 2 would give two mixtures whose weights differ in the third digit one fingerprint)
_REPR_OPTIONS: dict[str, Any] = {"edgeitems": 3, "threshold": sys.maxsize, "floatmode": "maxprec", "precision": 8,
                                 "suppress": False, "linewidth": 75, "nanstr": "nan", "infstr": "inf", "sign": "-",
                                 "formatter": None, "legacy": False}  # fmt: skip
if "override_repr" in np.get_printoptions():  # NumPy 2.1 and later
    _REPR_OPTIONS["override_repr"] = None
_KEPT = 256  # fingerprints kept at most, then started afresh
_kept: dict[bytes, str] = {}  # a digest of (name, identity) -> the fingerprint


def _hashed(name: str, identity: tuple[Any, ...]) -> str:
    """The fingerprint: a hash of the name and each part of the identity, an array by its dtype, shape and bytes,
    anything else by its repr (nested arrays in full)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8)
    # repr in full: NumPy abbreviates an array of more than 1,000 values with "...", so the weights of a mixture
    # of more sources, held in a tuple, would leave its fingerprint unchanged (a smaller array's repr is the same)
    with np.printoptions(**_REPR_OPTIONS):
        for part in identity:
            if isinstance(part, np.ndarray):
                digest.update(str(part.dtype).encode() + repr(part.shape).encode())
                digest.update(np.ascontiguousarray(part).tobytes())
            else:
                digest.update(repr(part).encode())
            digest.update(b"|")
    return digest.hexdigest()


def _kept_hash(name: str, identity: tuple[Any, ...]) -> str:
    """``_hashed``, computed once per distinct identity in a process. The key is a digest that sees no repr of a
    numeric array, only its bytes: equal keys are equal identities, part by part, and so equal fingerprints."""
    key = hashlib.blake2b(name.encode(), digest_size=32)
    with np.printoptions(**_REPR_OPTIONS):  # a leaf's repr as ``_hashed`` makes it
        for part in identity:
            if isinstance(part, np.ndarray):  # as ``_hashed`` hashes it (a subclass too)
                key.update(b"a" + str(part.dtype).encode() + repr(part.shape).encode() + b":")
                key.update(np.ascontiguousarray(part).tobytes())
            else:
                _key_of(key, part)
    found = _kept.get(key.digest())
    if found is None:
        found = _hashed(name, identity)
        if len(_kept) >= _KEPT:
            _kept.clear()  # not an eviction by iteration, which a thread adding at once would break
        _kept[key.digest()] = found
    return found


def _key_of(key: Any, part: Any) -> None:
    """Feed ``part`` to ``key`` so that parts fed alike have one repr: a plain numeric array by its dtype, shape and
    bytes (its repr is made of them), a tuple by its length and items, anything else by its repr; each piece with its
    length, so no two parts feed the same bytes."""
    if type(part) is np.ndarray and part.dtype.kind in "biuf":
        key.update(b"a" + part.dtype.str.encode() + repr(part.shape).encode() + b":")
        key.update(np.ascontiguousarray(part).tobytes())
    elif type(part) is tuple:
        key.update(b"t%d:" % len(part))
        for item in part:
            _key_of(key, item)
    else:
        text = repr(part).encode()
        key.update(b"r%d:" % len(text) + text)


class Uniform(Strategy):
    """A uniform shuffle of all N records each pass (``shuffle=False``: 0..N-1): the default.

    The sampler's ``order`` picks the permutation: ``"fast"`` is this Feistel bijection, ``"torch"``
    is torch's ``randperm`` (built in the torch glue, not here). The sampler's ``shuffle`` sets
    ``shuffle`` here, and the state's own ``shuffle`` field carries it, so the fingerprint does not.
    """

    name = "uniform"

    def __init__(self, shuffle: bool = True) -> None:
        self.shuffle = shuffle

    def __repr__(self) -> str:
        return "Uniform()" if self.shuffle else "Uniform(shuffle=False)"

    def pass_length(self, size: int, pass_index: int) -> int:
        return size

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        if not self.shuffle:
            return _identity_order
        return FeistelPermutation(size, seed, pass_index)


def _identity_order(positions: np.ndarray) -> np.ndarray:
    return positions


def id_array(name: str, values: Any) -> np.ndarray:
    """A 1-D array of non-negative integer ids (labels, groups, bands) from a list, a NumPy array or a
    1-D tensor, as int64; anything else is refused naming ``name``, the value and its position."""
    array = integer_array(name, values, "integer ids")
    if array.size and int(array.min()) < 0:
        raise ValueError(f"{name} must hold non-negative ids, got {int(array.min())} at position {int(array.argmin())}")
    return array.astype(np.int64, copy=False)


def weight_array(name: str, values: Any) -> np.ndarray:
    """A 1-D array of finite, non-negative weights that are not all zero, as float64 (a tensor of any
    float dtype, bfloat16 included, on any device or requiring grad, gives its values)."""
    array = one_dimensional(name, values)
    if array.dtype == object:
        array = _object_numbers(name, array)
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        raise ValueError(f"{name} must be finite and non-negative, got {array[bad[0]]} at position {int(bad[0])}")
    if not array.size or not array.any():
        raise ValueError(f"{name} must have a positive sum, got all zeros ({array.size} weights)")
    return array


def _object_numbers(name: str, array: np.ndarray) -> np.ndarray:
    """An object array (Python ints beyond 64 bits, or a mix of types) as float64, naming what is no number."""
    floats = []
    for at, value in enumerate(array.tolist()):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{name} must hold numbers, got {type(value).__name__} {value!r} at position {at}")
        try:
            floats.append(float(value))
        except OverflowError:
            raise ValueError(f"{name} must be finite, got {value} at position {at} (beyond float64)") from None
    return np.array(floats, dtype=np.float64)


def integer_array(
    name: str, values: Any, what: str, where: str = "at position", maximum: int = INT64_MAX
) -> np.ndarray:
    """``values`` as a 1-D integer array holding the same numbers: a NumPy integer array as it is (no copy),
    whole-number floats and Python ints as int64. A value above ``maximum`` (at most 2**63 - 1) is refused
    naming the value and its ``where``: a float such as 1e20, an unsigned 2**64 - 1 or a Python int beyond
    64 bits would otherwise be cast, and wrapped, to another number. A value that is no whole number is
    refused as not ``what``."""
    array = one_dimensional(name, values)
    kind = array.dtype.kind
    if not array.size:
        if kind in "iuf" or array.dtype == object:
            return array.astype(np.int64, copy=False)
        raise TypeError(f"{name} must hold {what}, got dtype {array.dtype}")
    bound = f"2**{maximum.bit_length()} - 1" if (maximum + 1) & maximum == 0 else str(maximum)
    if kind in "iu":
        at = int(np.argmax(array)) if maximum < INT64_MAX or kind == "u" else 0
        if int(array[at]) > maximum:
            raise ValueError(_outside(name, what, bound, int(array[at]), f"{where} {at}"))
        return array
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)))
        if bad.size:
            at = int(bad[0])
            raise TypeError(f"{name} must hold {what}, got dtype {array.dtype} with {float(array[at])!r} {where} {at}")
        outside = np.flatnonzero(np.abs(array) >= 2.0**63)  # beyond int64: a cast would wrap them
        if not outside.size:
            integers = array.astype(np.int64)  # exact: whole numbers within int64
            outside = np.flatnonzero(integers > maximum)
        if outside.size:
            at = int(outside[0])
            raise ValueError(_outside(name, what, bound, float(array[at]), f"{where} {at}"))
        return integers
    if array.dtype == object:  # Python ints beyond 64 bits, or a mix of types
        for at, value in enumerate(array.tolist()):
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise TypeError(f"{name} must hold {what}, got {type(value).__name__} {value!r} {where} {at}")
            if not -INT64_MAX - 1 <= int(value) <= maximum:
                raise ValueError(_outside(name, what, bound, int(value), f"{where} {at}"))
        return array.astype(np.int64)
    raise TypeError(f"{name} must hold {what}, got dtype {array.dtype}")


def _outside(name: str, what: str, bound: str, value: float, where: str) -> str:
    limit = f"of at most {bound}" if value > 0 else "within int64"
    return f"{name} must hold {what} {limit}, got {value!r} {where}"


def check_length(name: str, array: np.ndarray, size: int) -> None:
    """Per-record arrays must have one entry per record of the dataset."""
    if len(array) != size:
        raise ValueError(f"{name} must have one entry per record: length {size}, got {len(array)}")


def one_dimensional(name: str, values: Any) -> np.ndarray:
    """``values`` as a 1-D NumPy array, refusing anything else naming ``name``. A tensor is read duck-typed
    (this package imports no torch): detached and copied to the host first, so one that requires grad or
    lives on a GPU gives its values, and a float dtype NumPy lacks (bfloat16) is widened to float32, exactly."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a list, a NumPy array or a 1-D tensor, got {type(values).__name__}")
    if not isinstance(values, np.ndarray) and callable(getattr(values, "detach", None)):
        values = _tensor_values(name, values)
    array = np.asarray(values)
    if array.dtype.kind == "f" and isinstance(values, (list, tuple)) and all(type(v) is int for v in values):
        array = np.asarray(values, dtype=object)  # ints past int64 and negatives: keep each value exact
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    return array


def _tensor_values(name: str, tensor: Any) -> np.ndarray:
    """A tensor's values on the host as a NumPy array, or a ``TypeError`` naming ``name`` and what the tensor is."""
    described = f"a tensor of {getattr(tensor, 'dtype', '?')} on {getattr(tensor, 'device', '?')}"
    try:
        host = tensor.detach().cpu()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError) as error:
        raise TypeError(f"{name} must be a list, a NumPy array or a 1-D tensor with readable values, got {described}: "
                        f"{error}") from None  # fmt: skip
    try:
        return np.asarray(host)
    except TypeError:  # a dtype NumPy lacks: bfloat16 and the float8s widen to float32 exactly
        if not callable(getattr(host, "is_floating_point", None)) or not host.is_floating_point():
            raise TypeError(f"{name} must hold real numbers, got {described}") from None
        return np.asarray(host.float())
