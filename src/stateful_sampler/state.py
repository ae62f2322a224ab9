"""The sampler's saved state: a small, versioned, validated record, JSON-serialisable as a dict.

The order is a pure function of (seed, epoch, N), so the state needs only the identity of the
order and a cursor into it, never RNG internals: a few hundred bytes whatever N is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.layout import MAX_BATCH, MAX_EPOCH, MAX_RANKS, EpochLayout
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.policies import Tail
from stateful_sampler.order.strategy import Uniform

# 2 added ``epoch_end``, the end of the saved epoch as the saving run laid it out, so that a state
# saved at an epoch's end stays there whatever ranks and batch size resume it, and the strategy
# with a fingerprint of its arrays. Version 1 states (release 0.1.0) still load: they are uniform,
# and their epochs were always laid out from position 0. 3 (0.3.0) added ``strategy_state``, the
# strategy's own slot (``Strategy.state_at``: a mixture's draws, so that another mixture can continue
# it); version 2 states load with none.
STATE_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)

# The fields that identify the order: a state with other values here belongs to another order.
IDENTITY_FIELDS = ("size", "seed", "shuffle", "tail", "order", "strategy", "strategy_fingerprint")
_ADDED_IN = {"epoch_end": 2, "strategy": 2, "strategy_fingerprint": 2, "strategy_state": 3}


@dataclass(frozen=True)
class SamplerState:
    version: int
    size: int  # N, the records in the dataset
    seed: int
    shuffle: bool
    tail: str
    order: str
    strategy: str  # the strategy's name
    strategy_fingerprint: str  # a hash of the strategy's arrays and parameters
    epoch: int
    position: int  # global positions of the epoch consumed (a prefix of the epoch's order)
    carry_start: int  # stream position where the epoch starts (``carry``; 0 otherwise)
    epoch_end: int  # the epoch's length as the saving run laid it out; position == epoch_end: finished
    world_size: int  # ranks at save time; a different count on load is handled, not refused
    batch_size: int | None  # per-rank batch at save time
    strategy_state: dict[str, Any] | None = None  # the strategy's own slot (``Strategy.state_at``), validated by it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def finished(self) -> bool:
        """The saved epoch was consumed to its end: a resume starts nothing more of it."""
        return self.position == self.epoch_end

    @classmethod
    def from_dict(cls, data: Any) -> SamplerState:
        """Parse a saved dict, refusing anything that is not exactly a state of a readable version."""
        if not isinstance(data, Mapping):
            raise IncompatibleStateError("state", type(data).__name__, "a dict from StatefulSampler.state_dict()")
        if "sampler" in data and "size" not in data:
            raise IncompatibleStateError(
                "state",
                "a ResumableLoader state",
                "a StatefulSampler state",
                "pass it to ResumableLoader.load_state_dict, or pass state['sampler'] to the sampler",
            )
        version = data.get("version", "<missing>")
        if type(version) is not int or version not in _READABLE_VERSIONS:
            raise IncompatibleStateError("version", version, STATE_VERSION, "unknown state version")
        expected = {name for name in _FIELD_TYPES if version >= _ADDED_IN.get(name, 1)}
        for name in sorted(set(data) - expected):
            raise IncompatibleStateError(name, data[name], "<absent>", f"not a field of state version {version}")
        for name in sorted(expected - set(data)):
            raise IncompatibleStateError(name, "<missing>", _FIELD_TYPES[name])
        for name in sorted(expected):
            if not _TYPE_CHECKS[_FIELD_TYPES[name]](data[name]):
                raise IncompatibleStateError(name, data[name], _FIELD_TYPES[name], "wrong type")
        if data["tail"] not in {t.value for t in Tail}:
            raise IncompatibleStateError("tail", data["tail"], [t.value for t in Tail])
        for name, low, high in _RANGES:
            value = data.get(name)
            if value is not None and not low <= value <= high:
                raise IncompatibleStateError(name, value, f"an int in [{low}, {high}]")
        values = dict(data)
        if values.get("strategy_state") is not None:
            values["strategy_state"] = dict(values["strategy_state"])
        if version == 1:
            uniform = Uniform(values["shuffle"])
            values.update(strategy=uniform.name, strategy_fingerprint=uniform.fingerprint())
            values["epoch_end"] = _version_1_epoch_end(values)
        return cls(**{**values, "version": STATE_VERSION})

    def check_continues(
        self, current: SamplerState, pass_length: int, hint: str = "", strategy_continues: bool = False
    ) -> None:
        """Refuse a state that cannot continue ``current``'s order: first one of another order (so
        the error names the field that differs, e.g. a changed size, with the strategy's ``hint`` when
        only its data changed), then a cursor that does not fit the saved epoch's pass of
        ``pass_length`` positions. ``strategy_continues``: the strategy took the saved state as a
        continuation of its order (``Strategy.resume_from``), so its size and fingerprint may differ."""
        skipped = ("size", "strategy_fingerprint") if strategy_continues else ()
        for name in IDENTITY_FIELDS:
            if name in skipped:
                continue
            saved, mine = getattr(self, name), getattr(current, name)
            if saved != mine:
                reason = "the state belongs to another order"
                if hint and name in ("size", "strategy_fingerprint") and self.strategy == current.strategy:
                    reason = f"{reason}; {hint}"
                raise IncompatibleStateError(name, saved, mine, reason)
        self._check_cursor(pass_length)

    def _check_cursor(self, pass_length: int) -> None:
        if self.tail == Tail.CARRY.value:
            if self.carry_start > self.epoch * pass_length:
                raise IncompatibleStateError(
                    "carry_start", self.carry_start, f"at most epoch * pass length = {self.epoch * pass_length}"
                )
        elif self.carry_start != 0:
            raise IncompatibleStateError("carry_start", self.carry_start, 0, "only tail 'carry' uses it")
        longest = _longest_epoch(self, pass_length)
        if self.epoch_end > longest:
            raise IncompatibleStateError("epoch_end", self.epoch_end, f"at most {longest}", "beyond any epoch's end")
        shortest = _shortest_epoch(self, pass_length)
        if self.epoch_end < shortest:
            raise IncompatibleStateError(
                "epoch_end", self.epoch_end, f"at least {shortest}", "short of any epoch's end"
            )
        if self.position > self.epoch_end:
            raise IncompatibleStateError(
                "position", self.position, f"at most epoch_end = {self.epoch_end}", "beyond the end of the epoch"
            )


def _version_1_epoch_end(values: Mapping[str, Any]) -> int:
    """A version 1 state's epoch end: uniform passes of N, always laid out from position 0."""
    world_size = values["world_size"]
    return EpochLayout.build(
        Tail(values["tail"]),
        values["size"],
        world_size,
        values["epoch"],
        (values["batch_size"] or 1) * world_size,
        values["carry_start"],
    ).length


def _longest_epoch(state: SamplerState, pass_length: int) -> int:
    """The longest any layout of the saved epoch can be: carry stops at the end of its pass, pad adds
    fewer than W repeats, the others never pass the pass's length."""
    if state.tail == Tail.CARRY.value:
        return (state.epoch + 1) * pass_length - state.carry_start
    if state.tail == Tail.PAD.value and pass_length:
        return pass_length + state.world_size - 1
    return pass_length


def _shortest_epoch(state: SamplerState, pass_length: int) -> int:
    """The shortest any layout of the saved epoch can be: pad and uneven deal every position of the pass. Drop's
    end may come from a world size before an elastic resume (the state keeps the saving run's), and carry's
    depends on its carried records: for those only the longest is checked."""
    if state.tail in (Tail.PAD.value, Tail.UNEVEN.value):
        return pass_length
    return 0


_FIELD_TYPES = {field.name: str(field.type) for field in fields(SamplerState)}
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": lambda value: type(value) is int,
    "bool": lambda value: type(value) is bool,
    "str": lambda value: type(value) is str,
    "int | None": lambda value: value is None or type(value) is int,
    "dict[str, Any] | None": lambda value: value is None or isinstance(value, Mapping),
}
_RANGES = (
    ("size", 0, MAX_SIZE - 1),
    ("seed", 0, (1 << 63) - 1),
    ("epoch", 0, MAX_EPOCH),
    ("position", 0, (1 << 63) - 1),
    ("epoch_end", 0, (1 << 63) - 1),
    ("carry_start", 0, (1 << 126)),
    ("world_size", 1, MAX_RANKS),
    ("batch_size", 1, MAX_BATCH),
)
