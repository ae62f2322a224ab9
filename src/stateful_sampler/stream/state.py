"""The stream's saved state: the order's identity and a position, about 100 bytes (pickled) for any S.

The shard list is identified by two sums modulo the prime p = 2**61 - 1 over per-shard hashes
h_i = H(name_i, count_i, identity_i): ``digest`` = sum h_i and ``locator`` = sum (i+1)*h_i. When
exactly one shard changed (renamed, another record count, other content), both sums move by
d = h'_i - h_i and (i+1)*d, so the shard is i = (change in locator) / (change in digest) - 1: the
error names it, with O(1) state. Several changes give a quotient outside [0, S) with probability
about 1 - S/p. The same shards in another order leave ``digest`` as it is and move ``locator``.

``identity_i`` is what the reader's optional ``identity(shard) -> str`` says of the shard's content
(size and modification time, a parquet footer, a user's version or checksum). A reader without it
identifies a shard by (name, count) alone: a shard rewritten with the same name and count is then
not detected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.layout import MAX_EPOCH
from stateful_sampler.order.policies import Tail

STREAM_STATE_VERSION = 3
PRIME = (1 << 61) - 1


@dataclass(frozen=True)
class Manifest:
    """The shard list's identity: how many shards and records, and the two sums."""

    shards: int
    records: int
    digest: int
    locator: int

    @classmethod
    def of(cls, names: Sequence[str], counts: Sequence[int], identities: Sequence[str] | None = None) -> Manifest:
        digest = locator = 0
        for index, (name, count) in enumerate(zip(names, counts)):
            hashed = _shard_hash(name, int(count), None if identities is None else identities[index])
            digest = (digest + hashed) % PRIME
            locator = (locator + (index + 1) * hashed) % PRIME
        return cls(len(names), int(sum(counts)), digest, locator)

    def changed_shard(self, saved: Manifest) -> int | None:
        """The one shard whose name or count differs from ``saved``'s, if exactly one does."""
        delta = (self.digest - saved.digest) % PRIME
        if delta == 0:
            return None
        index = (self.locator - saved.locator) * pow(delta, -1, PRIME) % PRIME - 1
        return index if 0 <= index < self.shards else None


def _shard_hash(name: str, count: int, identity: str | None) -> int:
    text = f"{name}\0{count}" if identity is None else f"{name}\0{count}\0{identity}"
    raw = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(raw[:8], "little") % PRIME


def shard_identities(reader: Any, names: Sequence[str], counts: Sequence[int] | None = None) -> list[str] | None:
    """Each shard's content identity from the reader's optional ``identity(shard) -> str``, else None.

    ``counts``, when the user gave them, are checked against what the reader's optional
    ``known_count(shard)`` says it read with each identity (a parquet footer holds the true count): a
    stale count would deliver other records than the shard holds, with no error."""
    identity = getattr(reader, "identity", None)
    if identity is None:
        return None
    known_count = getattr(reader, "known_count", None) if counts is not None else None
    identities = []
    for index, name in enumerate(names):
        value = identity(name)
        if not isinstance(value, str):
            raise TypeError(
                f"{type(reader).__name__}.identity({name!r}) must return a str, got {type(value).__name__} {value!r}"
            )
        identities.append(value)
        if known_count is not None and counts is not None:
            check_counts([name], [counts[index]], [known_count(name)], index)
    return identities


def check_counts(names: Sequence[str], counts: Sequence[int], known: Sequence[int | None], first: int = 0) -> None:
    """Refuse a given count that contradicts the count read with the shard's identity (None: none was read)."""
    for index, (name, count, true) in enumerate(zip(names, counts, known), first):
        if true is not None and true != count:
            raise ValueError(
                f"counts[{index}] ({name!r}) is {count}, but the shard holds {true} records (read with its "
                f"identity): pass counts[{index}]={true}, or leave counts unset to read every count"
            )


# Version 1 was every field by name (181 B pickled); version 2 packs what a resume only checks into ``order``;
# version 3 adds the order's ``spread`` to it. Versions 1 and 2 are of the order before ``spread``: spread 1.
_V1_FIELDS = {"version": int, "shards": int, "records": int, "digest": int, "locator": int, "seed": int, "window": int,
              "tail": str, "epoch": int, "position": int, "world_size": int, "batch_size": int}  # fmt: skip
_V2_FIELDS = {"version": int, "epoch": int, "position": int, "order": str}  # and version 3's
_TAILS = (Tail.PAD.value, Tail.DROP.value)  # the tail's code in ``order`` is its index here
_ORDER_EXPECTED = "the packed order of ShardedStream.state_dict() (base64url)"


@dataclass(frozen=True)
class StreamState:
    """Where the stream is (``epoch``, ``position``: positions consumed by every rank together, so any
    world size, batch size or worker count continues it) and what the order is, which a resume only
    checks: the shard list's ``Manifest``, ``seed``, ``window``, ``tail`` and ``spread``.

    Saved as ``{"version": 3, "epoch": e, "position": p, "order": "..."}``: ``order`` packs the checked
    fields (the two sums as 8 bytes each, the rest as LEB128 varints) in base64url, about 95 B pickled.
    States of versions 1 (every field by name) and 2 (no ``spread``) still load, as spread 1: the order
    they were saved with.

    Example:
        >>> state = StreamState.from_dict(
        ...     {"version": 2, "epoch": 0, "position": 12, "order": "vNpT0mf3mgvmB5LJkt2gHwZ5AgAA"})
        >>> state.shards, state.records, state.seed, state.window, state.tail, state.spread
        (6, 121, 0, 2, 'pad', 1)
        >>> state.to_dict()["version"], state.to_dict()["order"]
        (3, 'vNpT0mf3mgvmB5LJkt2gHwZ5AgAAAQ')
    """

    shards: int
    records: int
    digest: int
    locator: int
    seed: int
    window: int
    tail: str
    spread: int
    epoch: int
    position: int

    def to_dict(self) -> dict[str, Any]:
        order = _pack(self.digest, self.locator, self.shards, self.records, self.window, self.seed,
                      _TAILS.index(self.tail), self.spread)  # fmt: skip
        return {"version": STREAM_STATE_VERSION, "epoch": self.epoch, "position": self.position, "order": order}

    def manifest(self) -> Manifest:
        return Manifest(self.shards, self.records, self.digest, self.locator)

    @classmethod
    def from_dict(cls, data: Any) -> StreamState:
        """Parse a saved dict (version 3, 2 or 1), refusing anything that is not exactly a state of its version."""
        if not isinstance(data, Mapping):
            raise IncompatibleStateError("state", type(data).__name__, "a dict from ShardedStream.state_dict()")
        version = data.get("version")
        if type(version) is not int or version not in (1, 2, STREAM_STATE_VERSION):
            raise IncompatibleStateError(
                "version", data.get("version", "<missing>"), STREAM_STATE_VERSION, "unknown stream state version"
            )
        expected = _V1_FIELDS if version == 1 else _V2_FIELDS
        for name in sorted(set(data) ^ set(expected)):
            saved = data.get(name, "<missing>")
            kind = expected.get(name)
            raise IncompatibleStateError(name, saved, "<absent>" if kind is None else kind.__name__,
                                         "not a field of this version")  # fmt: skip
        for name, kind in expected.items():
            value = data[name]
            if type(value) is not kind or (isinstance(value, int) and value < 0):
                raise IncompatibleStateError(name, value, "a non-negative int" if kind is int else kind.__name__)
        if int(data["epoch"]) > MAX_EPOCH:
            raise IncompatibleStateError("epoch", data["epoch"], f"at most {MAX_EPOCH}")
        if version == 1:
            if data["tail"] not in _TAILS:
                raise IncompatibleStateError("tail", data["tail"], list(_TAILS))
            checked = {name: data[name] for name in ("shards", "records", "digest", "locator", "seed", "window")}
            return cls(**checked, tail=data["tail"], spread=1, epoch=data["epoch"], position=data["position"])
        digest, locator, shards, records, window, seed, tail, *spread = _unpack(data["order"], 5 if version == 2 else 6)
        return cls(shards, records, digest, locator, seed, window, _TAILS[tail], spread[0] if spread else 1,
                   data["epoch"], data["position"])  # fmt: skip

    def check_continues(
        self, current: StreamState, names: Sequence[str], counts: Sequence[int], identities: Sequence[str] | None
    ) -> None:
        """Refuse a state of another order, naming the shard when one shard changed."""
        if self.shards != current.shards:
            raise IncompatibleStateError(
                "shards", self.shards, current.shards, "shards were added or removed since the save"
            )
        if self.digest == current.digest and self.locator != current.locator:
            raise IncompatibleStateError(
                "shard order",
                "the same shards in another order",
                "the order of the save",
                "the shard list is part of the order: pass the shards in the order they were saved with",
            )
        if (self.digest, self.locator) != (current.digest, current.locator):
            index = current.manifest().changed_shard(self.manifest())
            if index is None:
                raise IncompatibleStateError(
                    "shards",
                    "several shards of other names, record counts or contents",
                    f"the {current.shards} shards of the save",
                    "several shards changed since the save",
                )
            content = "" if identities is None else f", content {identities[index]!r}"
            raise IncompatibleStateError(
                f"shards[{index}]",
                "a shard of another name, record count or content",
                f"{names[index]!r} with {int(counts[index])} records{content}",
                f"shard {names[index]!r} changed since the save",
            )
        for name in ("records", "seed", "window", "tail"):
            saved, mine = getattr(self, name), getattr(current, name)
            if saved != mine:
                raise IncompatibleStateError(name, saved, mine, "the state belongs to another order")
        if self.spread != current.spread:
            raise IncompatibleStateError(
                "spread",
                self.spread,
                current.spread,
                f"the state belongs to another order: build the stream with spread={self.spread}, or leave spread "
                "unset to take the state's",
            )
        if self.position > self.records:
            raise IncompatibleStateError(
                "position", self.position, f"at most {self.records}", "beyond the end of the epoch"
            )


def _pack(digest: int, locator: int, *values: int) -> str:
    """The two sums as 8 little-endian bytes each, then each value as an LEB128 varint, in base64url."""
    raw = bytearray(digest.to_bytes(8, "little") + locator.to_bytes(8, "little"))
    for value in values:
        while value >= 0x80:
            raw.append(value & 0x7F | 0x80)
            value >>= 7
        raw.append(value)
    return base64.urlsafe_b64encode(bytes(raw)).decode("ascii").rstrip("=")


def _unpack(order: str, fields: int) -> list[int]:
    """[digest, locator, shards, records, window, seed, tail code(, spread)] of a packed ``order`` of ``fields``
    varints, which must be exactly what ``_pack`` writes for them; an unknown tail code is refused naming ``tail``."""
    try:
        raw = base64.b64decode(order + "=" * (-len(order) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise IncompatibleStateError("order", order, _ORDER_EXPECTED) from None
    values, value, shift = [], 0, 0
    for byte in raw[16:]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            values.append(value)
            value, shift = 0, 0
    if len(raw) < 16 or len(values) != fields or shift:
        raise IncompatibleStateError("order", order, _ORDER_EXPECTED)
    digest, locator = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")
    if values[4] >= len(_TAILS):
        raise IncompatibleStateError("tail", values[4], list(_TAILS))
    if fields > 5 and values[5] < 1:
        raise IncompatibleStateError("spread", values[5], "at least 1")
    if _pack(digest, locator, *values) != order:  # an overlong varint, trailing bits: not a state we wrote
        raise IncompatibleStateError("order", order, _ORDER_EXPECTED)
    return [digest, locator, *values]
