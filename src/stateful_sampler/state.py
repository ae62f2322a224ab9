"""The sampler's saved state: a small, versioned, validated record, JSON-serialisable as a dict.

The order is a pure function of (seed, epoch, N), so the state needs only the identity of the
order and a cursor into it, never RNG internals: a few hundred bytes whatever N is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.layout import EpochLayout, Tail

STATE_VERSION = 1

# The fields that identify the order: a state with other values here belongs to another order.
IDENTITY_FIELDS = ("size", "seed", "shuffle", "tail", "order")


@dataclass(frozen=True)
class SamplerState:
    version: int
    size: int  # N, the records in the dataset
    seed: int
    shuffle: bool
    tail: str
    order: str
    epoch: int
    position: int  # global positions of the epoch consumed
    carry_start: int  # stream position where the epoch starts (``carry``; 0 otherwise)
    world_size: int  # ranks at save time; a different count on load is handled, not refused
    batch_size: int | None  # per-rank batch at save time; sets carry's epoch boundaries

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> SamplerState:
        """Parse a saved dict, refusing anything that is not exactly a state of this version."""
        if not isinstance(data, Mapping):
            raise IncompatibleStateError("state", type(data).__name__, "a dict from StatefulSampler.state_dict()")
        if data.get("version") != STATE_VERSION:
            raise IncompatibleStateError("version", data.get("version", "<missing>"), STATE_VERSION, "unknown state version")
        expected = {f.name for f in fields(cls)}
        for name in sorted(set(data) - expected):
            raise IncompatibleStateError(name, data[name], "<absent>", "not a field of this state version")
        for name in sorted(expected - set(data)):
            raise IncompatibleStateError(name, "<missing>", _TYPE_NAMES[name])
        for name, value in data.items():
            if not _has_type(name, value):
                raise IncompatibleStateError(name, value, _TYPE_NAMES[name], "wrong type")
        if data["tail"] not in {t.value for t in Tail}:
            raise IncompatibleStateError("tail", data["tail"], [t.value for t in Tail])
        for name in ("size", "seed", "epoch", "position", "carry_start"):
            if data[name] < 0:
                raise IncompatibleStateError(name, data[name], "a non-negative int")
        if data["world_size"] < 1 or (data["batch_size"] is not None and data["batch_size"] < 1):
            bad = "world_size" if data["world_size"] < 1 else "batch_size"
            raise IncompatibleStateError(bad, data[bad], "a positive int")
        return cls(**data)

    def global_batch(self) -> int:
        return (self.batch_size or 1) * self.world_size

    def layout(self) -> EpochLayout:
        """The layout of the saved epoch as the run that saved it saw it."""
        return EpochLayout.build(
            Tail(self.tail), self.size, self.world_size, self.epoch, self.global_batch(), self.carry_start
        )

    def check_continues(self, current: SamplerState) -> None:
        """Refuse a state that cannot continue ``current``'s order: first one of another order (so
        the error names the field that differs, e.g. a changed size), then an inconsistent cursor."""
        for name in IDENTITY_FIELDS:
            saved, mine = getattr(self, name), getattr(current, name)
            if saved != mine:
                raise IncompatibleStateError(name, saved, mine, "the state belongs to another order")
        self._check_cursor()

    def _check_cursor(self) -> None:
        if self.tail == Tail.CARRY.value:
            if self.carry_start > self.epoch * self.size:
                raise IncompatibleStateError(
                    "carry_start", self.carry_start, f"at most epoch * size = {self.epoch * self.size}"
                )
        elif self.carry_start != 0:
            raise IncompatibleStateError("carry_start", self.carry_start, 0, "only tail 'carry' uses it")
        length = self.layout().length
        if self.position > length:
            raise IncompatibleStateError("position", self.position, f"at most {length}", "beyond the end of the epoch")


_TYPE_NAMES = {
    "version": "int",
    "size": "int",
    "seed": "int",
    "shuffle": "bool",
    "tail": "str",
    "order": "str",
    "epoch": "int",
    "position": "int",
    "carry_start": "int",
    "world_size": "int",
    "batch_size": "int or None",
}


def _has_type(name: str, value: Any) -> bool:
    expected = _TYPE_NAMES[name]
    if expected == "bool":
        return type(value) is bool
    if expected == "str":
        return type(value) is str
    if expected == "int or None":
        return value is None or type(value) is int
    return type(value) is int
