"""The stream's saved state: the order's identity and a position, a few hundred bytes for any S.

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

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.layout import MAX_EPOCH
from stateful_sampler.order.policies import Tail

STREAM_STATE_VERSION = 1
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
        true = None if known_count is None else known_count(name)
        if true is not None and counts is not None and true != counts[index]:
            raise ValueError(
                f"counts[{index}] ({name!r}) is {counts[index]}, but the shard holds {true} records (read with its "
                f"identity): pass counts[{index}]={true}, or leave counts unset to read every count"
            )
    return identities


@dataclass(frozen=True)
class StreamState:
    version: int
    shards: int
    records: int
    digest: int
    locator: int
    seed: int
    window: int
    tail: str
    epoch: int
    position: int  # epoch positions consumed by every rank together
    world_size: int  # informational: another world size continues the epoch
    batch_size: int  # informational: another batch size or worker count continues it too

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def manifest(self) -> Manifest:
        return Manifest(self.shards, self.records, self.digest, self.locator)

    @classmethod
    def from_dict(cls, data: Any) -> StreamState:
        """Parse a saved dict, refusing anything that is not exactly a state of this version."""
        if not isinstance(data, Mapping):
            raise IncompatibleStateError("state", type(data).__name__, "a dict from ShardedStream.state_dict()")
        if data.get("version") != STREAM_STATE_VERSION:
            raise IncompatibleStateError(
                "version", data.get("version", "<missing>"), STREAM_STATE_VERSION, "unknown stream state version"
            )
        expected = {f.name: f.type for f in fields(cls)}
        for name in sorted(set(data) ^ set(expected)):
            saved = data.get(name, "<missing>")
            raise IncompatibleStateError(name, saved, expected.get(name, "<absent>"), "not a field of this version")
        for name, kind in expected.items():
            value = data[name]
            wanted = str if kind == "str" else int
            if type(value) is not wanted or (isinstance(value, int) and value < 0):
                raise IncompatibleStateError(name, value, f"a non-negative {kind}" if kind == "int" else kind)
        if int(data["epoch"]) > MAX_EPOCH:
            raise IncompatibleStateError("epoch", data["epoch"], f"at most {MAX_EPOCH}")
        if data["tail"] not in (Tail.PAD.value, Tail.DROP.value):
            raise IncompatibleStateError("tail", data["tail"], ["pad", "drop"])
        return cls(**data)

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
        if self.position > self.records:
            raise IncompatibleStateError(
                "position", self.position, f"at most {self.records}", "beyond the end of the epoch"
            )
