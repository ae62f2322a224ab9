"""The stream's saved state: the order's identity and a position, a few hundred bytes for any S.

The shard list is identified by two sums modulo the prime p = 2**61 - 1 over per-shard hashes
h_i = H(name_i, count_i): ``digest`` = sum h_i and ``locator`` = sum (i+1)*h_i. When exactly one
shard changed (renamed, or another record count), both sums move by d = h'_i - h_i and (i+1)*d,
so the shard is i = (change in locator) / (change in digest) - 1: the error names it, with O(1)
state. Several changes give a quotient outside [0, S) with probability about 1 - S/p.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from stateful_sampler.errors import IncompatibleStateError
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
    def of(cls, names: Sequence[str], counts: Sequence[int]) -> Manifest:
        digest = locator = 0
        for index, (name, count) in enumerate(zip(names, counts)):
            hashed = _shard_hash(name, int(count))
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


def _shard_hash(name: str, count: int) -> int:
    raw = hashlib.sha256(f"{name}\0{count}".encode()).digest()
    return int.from_bytes(raw[:8], "little") % PRIME


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
        if data["tail"] not in (Tail.PAD.value, Tail.DROP.value):
            raise IncompatibleStateError("tail", data["tail"], ["pad", "drop"])
        return cls(**data)

    def check_continues(self, current: StreamState, names: Sequence[str], counts: Sequence[int]) -> None:
        """Refuse a state of another order, naming the shard when one shard changed."""
        if self.shards != current.shards:
            raise IncompatibleStateError(
                "shards", self.shards, current.shards, "shards were added or removed since the save"
            )
        if (self.digest, self.locator) != (current.digest, current.locator):
            index = current.manifest().changed_shard(self.manifest())
            if index is None:
                raise IncompatibleStateError(
                    "digest", self.digest, current.digest, "several shards changed since the save, or their order"
                )
            raise IncompatibleStateError(
                f"shards[{index}]",
                "a shard of another name or record count",
                f"{names[index]!r} with {int(counts[index])} records",
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
