"""A ``StatefulSampler`` over rows of a ``RowOrder``: the sampler's machinery, plus a resume anchor in the state.

Also the steps both row samplers take before it (``row_order``) and their default ``window``.

The sampler strides through row indices as it does through records (tails, ranks, elastic resume,
keys, ``consumed_batches``); the subclasses turn each row index into what they yield. A row's window
starts where the windows before it end, which is only known by walking them, so the state gains one
field, ``packing``: the saved row's window and where it starts, (whole-record packing) the row count of
the saved epoch, and the settings that shaped the rows (``seq_len`` or ``max_tokens``, ``window``, ...,
and a hash of the lengths). Loading it makes a resume O(window); a state packed with other settings is
refused naming the one that changed, and the anchor is checked against a hash of the order's identity,
so a state is never read with another order's anchor.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from numbers import Integral
from typing import Any

from torch.utils.data import IterableDataset

from stateful_sampler.checks import check_int
from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.keys import SampleKey
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.layout import MAX_EPOCH
from stateful_sampler.order.length_grouped import LengthGrouped
from stateful_sampler.order.lengths import (
    MAX_TOKENS,
    legacy_lengths_digest,
    lengths_digest,
    refuse_longer,
    token_lengths,
)
from stateful_sampler.order.rows import PassRows, RowOrder, strategy_setting
from stateful_sampler.order.strategy import SavedOrder, Strategy, Uniform
from stateful_sampler.sampler import StatefulSampler
from stateful_sampler.state import SamplerState

# 2 (0.3.0) added ``settings``, so that a resume with another seq_len, window or lengths names the setting;
# 3 hashes the lengths by a fold at memory speed (``lengths.lengths_digest``) instead of blake2b over them all.
# Version 1 anchors (0.2.0) and 2 still load, their lengths hashed the old way; without settings (1), a change
# is refused by the strategy's fingerprint.
PACKING_VERSION = 3
_FIELDS = {
    1: ("version", "pass", "window", "start", "rows", "check"),
    2: ("version", "pass", "window", "start", "rows", "settings", "check"),
    3: ("version", "pass", "window", "start", "rows", "settings", "check"),
}
_BLAKE2B_LENGTHS = (1, 2)  # anchor versions whose lengths digest (and so fingerprint) is blake2b's
_IDENTITY = ("size", "seed", "strategy", "strategy_fingerprint")

DEFAULT_WINDOW = 4096  # shuffle positions per window: the unit of packing and of a resume's cost
# What a state saved before strategies could be packed (no such settings) was packed over.
_UNIFORM_SETTINGS = dict(zip(("strategy", "strategy_fingerprint"), strategy_setting(Uniform())))


def packed_strategy(strategy: Any, size: int) -> Strategy | None:
    """The strategy whose draws are packed, checked against the ``size`` lengths (``None``: the default uniform
    shuffle, whose rows are those of every release before ``strategy=``)."""
    if strategy is None:
        return None
    if not isinstance(strategy, Strategy) or isinstance(strategy, RowOrder):
        raise TypeError(
            f"strategy must be a Strategy such as Uniform(), Weighted(...) or Mixture(...), got {type(strategy).__name__}"
        )
    if isinstance(strategy, (Grouped, LengthGrouped)):
        raise TypeError(
            f"strategy={strategy!r} groups records into batches (with repeats that only even out ranks): packing "
            f"makes its own rows, so pack over the order itself (Uniform, Weighted, Mixture, Curriculum, Stratified)"
        )
    try:
        strategy.check(size)
    except ValueError as error:
        raise ValueError(f"strategy={strategy!r} does not order the {size} records of lengths: {error}") from None
    if isinstance(strategy, Uniform) and strategy.shuffle:
        return None
    return strategy


def row_order(
    lengths: Any,
    budget_name: str,
    budget: int,
    *,
    seed: int,
    window: int,
    name: str,
    longer: str | None,
    split: bool = False,
    padded: bool = False,
    truncate: bool = False,
    strategy: Any = None,
) -> RowOrder:
    """The ``RowOrder`` a row sampler is built on, from its arguments, checked in this order: the lengths, the
    budget (``budget_name``: ``seq_len`` or ``max_tokens``), a record longer than the budget (refused with the
    advice ``longer``; ``None``: every record fits, as split or truncated rows), the seed and the window. The
    caller checks its flags (``split``, ``padded``, ``truncate``) first: written once, so the two samplers
    refuse the same bad value with the same error."""
    if isinstance(lengths, IterableDataset):  # refused before a record of it is read
        raise TypeError(
            f"lengths: got a {type(lengths).__name__}, a stream of records, not their token counts: pack a stream "
            f"with stateful_sampler.stream.PackedStream (a token budget over a stream is not built)"
        )
    array = token_lengths(lengths)
    capacity = check_int(budget_name, budget, minimum=1, maximum=MAX_TOKENS)
    if longer is not None:
        refuse_longer(array, capacity, budget_name, longer)
    drawn = packed_strategy(strategy, len(array))
    return RowOrder(
        array,
        capacity,
        seed=check_int("seed", seed, maximum=(1 << 63) - 1),
        split=split,
        window=check_int("window", window, minimum=1),
        padded=padded,
        truncate=truncate,
        name=name,
        strategy=drawn,
    )


class KeyedList(list):  # type: ignore[type-arg]
    """A row's (or batch's) items with the row's ``SampleKey``: ``key.index`` is the row within its epoch,
    ``key.is_padding`` marks a repeat that only evens out the ranks. Pickles with its key (workers)."""

    def __init__(self, items: list[Any], key: SampleKey) -> None:
        super().__init__(items)
        self.key = key

    @property
    def is_padding(self) -> bool:
        return self.key.is_padding

    def __reduce__(self) -> Any:
        return (type(self), (list(self), self.key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r}, key={self.key!r})"


class RowSampler(StatefulSampler):
    """Yields ``self._item(key)`` for each row key; the state carries the anchor of its row."""

    strategy: RowOrder

    def __init__(
        self, order: RowOrder, *, num_replicas: int | None, rank: int | None, tail: str, batch_size: int | None
    ) -> None:
        super().__init__(
            len(order.lengths),
            seed=order.seed,
            num_replicas=num_replicas,
            rank=rank,
            tail=tail,
            batch_size=batch_size,
            yield_keys=True,  # the keys carry each row's epoch, position and padding mark to ``_item``
            strategy=order,
        )

    def __iter__(self) -> Iterator[Any]:
        return map(self._item, super().__iter__())

    def _item(self, key: SampleKey) -> Any:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        """The settings that shape the rows, by the names the constructor takes them (``lengths``: a hash of
        their values): what a saved state records, so that a resume with another one is refused naming it."""
        raise NotImplementedError

    def rows_in_epoch(self, epoch: int | None = None) -> int:
        """Rows (or batches) of an epoch over all ranks, before padding."""
        return self.strategy.rows(self.epoch if epoch is None else check_int("epoch", epoch, maximum=MAX_EPOCH)).count()

    def extra_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The anchor of the row the saved position reads next (``packing``), taken off again by ``load_state_dict``."""
        return {"packing": self._anchor(state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise IncompatibleStateError(
                "state", type(state).__name__, f"a dict from {type(self).__name__}.state_dict()"
            )
        state = dict(state)
        packing = state.pop("packing", "<missing>")
        legacy = isinstance(packing, Mapping) and packing.get("version") in _BLAKE2B_LENGTHS
        with self.strategy.hashed_as_before(legacy):
            self._load_checked(state, packing)

    def _load_checked(self, state: dict[str, Any], packing: Any) -> None:
        _refuse_other_fields(packing)
        order = self._continuation(state)
        changed = order is not self.strategy and order.fingerprint() != state.get("strategy_fingerprint")
        self._refuse_changed_settings(packing, state.get("size"), order, changed)
        mine = {"size": self.size, "seed": self.seed, "strategy": order.name}
        mine["strategy_fingerprint"] = order.fingerprint()
        for name in _IDENTITY:
            if changed and name in ("size", "strategy_fingerprint"):
                continue  # the packed strategy continues the saved one (checked by it), from the splice on
            if name in state and state[name] != mine[name]:
                reason = "the state belongs to another order"
                if name == "strategy_fingerprint" and isinstance(packing, Mapping) and packing.get("version") == 1:
                    reason += (
                        f"; a version 1 packing state (0.2.0) does not record its settings: one of "
                        f"{', '.join(self._settings())} differs from the saved run's"
                    )
                raise IncompatibleStateError(name, state[name], mine[name], reason)
        # a splice reads the saved order's anchor (its window and start hold in the continuation): checked as its
        word = _check_word(state.get("strategy_fingerprint"), self.seed, state.get("size")) if changed else None
        anchor = _checked_anchor(
            packing, word or _check_word(order.fingerprint(), self.seed, self.size), self._settings()
        )
        rows = order.rows(anchor["pass"])
        if anchor["window"] >= rows.starts.count:
            raise IncompatibleStateError("packing.window", anchor["window"], f"below {rows.starts.count} windows")
        rows.starts.remember(anchor["window"], anchor["start"])  # a fact of this order (checked): kept even if
        if anchor["rows"] is not None and not changed:  # the load below is refused (a splice keeps the windows
            rows.starts.remember(rows.starts.count, anchor["rows"])  # up to the saved one, not the pass's total)
        # The sampler compares the state with its own, whose epoch length it computes: moved to the saved
        # epoch first (whose length the anchor holds), it never walks the windows of the epoch it was in.
        # A probe takes any refusal, so this sampler is untouched by a state it refuses.
        epoch = SamplerState.from_dict(state).epoch
        probe = copy.copy(self)
        probe.set_epoch(epoch)
        StatefulSampler.load_state_dict(probe, state)
        self.set_epoch(epoch)
        super().load_state_dict(state)

    def _continuation(self, state: Mapping[str, Any]) -> RowOrder:
        """The order this sampler continues ``state`` with: its own, or the packed strategy's continuation of
        the saved one (``RowOrder.resume_from``), which the sampler's ``load_state_dict`` takes over too."""
        try:
            saved = SamplerState.from_dict(state)
        except (IncompatibleStateError, TypeError, ValueError):
            return self.strategy  # refused, naming the field, where the state is checked
        if saved.strategy != self.strategy.name:
            return self.strategy
        order = SavedOrder(saved.size, saved.strategy, saved.strategy_fingerprint, saved.strategy_state, saved.epoch, 0)
        return self.strategy.resume_from(order) or self.strategy

    def _refuse_changed_settings(self, packing: Any, saved_size: Any, order: RowOrder, changed: bool) -> None:
        """Refuse a state whose rows were packed with other settings, naming the first that changed; an
        anchor that is no version 2 or 3 anchor is left to ``_checked_anchor``, which names what is wrong with it.
        ``order``: the order this sampler continues the state with; ``changed``: it continues another one (its
        packed strategy does), over the saved lengths followed by appended ones."""
        if not isinstance(packing, Mapping) or packing.get("version") not in (2, 3):
            return
        saved = packing.get("settings")
        if not isinstance(saved, Mapping):
            return
        mine = {**self._settings(), **strategy_settings(order)}
        if changed:
            lengths = self.strategy.lengths
            if type(saved_size) is int and 0 <= saved_size <= len(lengths):
                digest = legacy_lengths_digest if packing.get("version") in _BLAKE2B_LENGTHS else lengths_digest
                mine["lengths"] = digest(lengths[:saved_size])[:16]  # the saved records' lengths kept
            mine = {name: value for name, value in mine.items() if name not in _UNIFORM_SETTINGS}
        for name, value in {**({} if changed else _UNIFORM_SETTINGS), **mine}.items():
            if name in _UNIFORM_SETTINGS:
                before = saved.get(name, _UNIFORM_SETTINGS[name])
            elif name in saved:
                before = saved[name]
            else:
                continue
            if before != value:
                if name in _UNIFORM_SETTINGS:
                    reason = (
                        f"the saved run's rows were packed over the strategy {saved.get('strategy', 'uniform')!r} "
                        f"(fingerprint {before if name == 'strategy_fingerprint' else saved.get(name)}): build the "
                        f"sampler with the strategy it was saved with (another strategy, or other settings of it, "
                        f"draws other records)"
                    )
                    raise IncompatibleStateError(f"packing.settings.{name}", before, value, reason)
                if name == "lengths":
                    reason = (
                        f"the lengths are not the saved run's ({saved_size} records saved, {self.size} here; "
                        f"compared by a hash of their values): resume with the lengths it was saved with"
                    )
                else:
                    reason = (
                        f"the saved run's rows were packed with {name}={saved[name]!r}: build the sampler with "
                        f"{name}={saved[name]!r} to resume it (another {name} is another order)"
                    )
                raise IncompatibleStateError(f"packing.settings.{name}", before, value, reason)

    def _anchor(self, state: Mapping[str, Any]) -> dict[str, Any]:
        pass_index, row = self._row_at(state)
        rows = self.strategy.rows(pass_index)
        window, start = rows.anchor(row)
        count = rows.saved_total()
        anchor: dict[str, Any] = {"version": PACKING_VERSION, "pass": pass_index, "window": window, "start": start}
        anchor["rows"] = count
        anchor["settings"] = self._settings()
        anchor["check"] = _check(_check_word(self.strategy.fingerprint(), self.seed, self.size), anchor)
        return anchor

    def _row_at(self, state: Mapping[str, Any]) -> tuple[int, int]:
        """The pass and row a saved cursor reads next (padding wraps to the pass's start; ``carry``
        reads on into the next passes, which all have one length)."""
        epoch, length = state["epoch"], self.strategy.rows(state["epoch"]).count()
        if state["tail"] != "carry":  # the epoch's own pass (padding reads its first rows again)
            return epoch, state["position"] % length
        offset = state["carry_start"] - epoch * length + state["position"]
        if not self.strategy.split:
            return epoch, offset % length
        return epoch + offset // length, offset % length


def checked_rows(order: RowOrder, epoch: Any, row: Any, *, name: str, unit: str) -> PassRows:
    """Epoch ``epoch``'s rows of ``order``, once ``epoch`` and ``row`` (the argument ``name``) are checked to be one
    of them: a row sampler's lookup (``PackedRows.plan``, ``TokenBudgetBatches.batch``) never answers for a row the
    epoch does not have."""
    epoch = check_int("epoch", epoch, maximum=MAX_EPOCH)
    if isinstance(row, bool) or not isinstance(row, Integral):
        raise TypeError(f"{name} must be an int, got {type(row).__name__} {row!r}")
    rows = order.rows(epoch)
    if not rows.has_row(int(row)):
        raise IndexError(
            f"{name} must lie in [0, {rows.count()}), the {unit} of epoch {epoch} over all ranks, got {row}"
        )
    return rows


def strategy_settings(order: RowOrder) -> dict[str, Any]:
    """The packed strategy's settings, for a row sampler's ``_settings``: none for the default uniform shuffle
    (its states are as before)."""
    drawn = order.drawn
    return {} if drawn is None else dict(zip(("strategy", "strategy_fingerprint"), strategy_setting(drawn)))


def _check_word(fingerprint: Any, seed: int, size: Any) -> str:
    """What an anchor's check binds it to: the order (its fingerprint), the seed and the size."""
    return f"{fingerprint}|{seed}|{size}"


def _check(word: str, anchor: Mapping[str, Any]) -> str:
    fields = _FIELDS[anchor["version"]]
    values = "|".join(_canonical(anchor[name]) for name in fields[:-1])
    return hashlib.blake2b(f"{word}|{values}".encode(), digest_size=8).hexdigest()


def _canonical(value: Any) -> str:
    """A value as the check hashes it: settings whatever order a serialiser kept their keys in."""
    return json.dumps(dict(value), sort_keys=True) if isinstance(value, Mapping) else str(value)


def _refuse_other_fields(packing: Any) -> None:
    """Refuse an anchor of a known version without exactly that version's fields: checked before the identity,
    which an anchor's version decides the lengths digest of (a relabelled anchor is named, not its fingerprint)."""
    if not isinstance(packing, Mapping) or packing.get("version") not in _FIELDS:
        return
    version = packing["version"]
    fields = _FIELDS[version]
    if type(version) is int and set(packing) != set(fields):
        raise IncompatibleStateError("packing", sorted(packing), list(fields), f"not a version {version} anchor")


def _checked_anchor(packing: Any, word: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The saved anchor, refused unless it is exactly a version 1, 2 or 3 anchor of this order."""
    if not isinstance(packing, Mapping):
        raise IncompatibleStateError("packing", packing, "the anchor a row sampler's state_dict() saves")
    version = packing.get("version", "<missing>")
    if type(version) is not int or version not in _FIELDS:
        raise IncompatibleStateError("packing.version", version, PACKING_VERSION, "unknown anchor version")
    _refuse_other_fields(packing)
    for name in ("pass", "window", "start"):
        if type(packing[name]) is not int or packing[name] < 0:
            raise IncompatibleStateError(f"packing.{name}", packing[name], "a non-negative int")
    if packing["rows"] is not None and (type(packing["rows"]) is not int or packing["rows"] < 1):
        raise IncompatibleStateError("packing.rows", packing["rows"], "a positive int or None")
    if version > 1 and (not isinstance(packing["settings"], Mapping) or set(packing["settings"]) != set(settings)):
        raise IncompatibleStateError("packing.settings", packing["settings"], dict(settings), "not this sampler's")
    if packing["check"] != _check(word, packing):
        raise IncompatibleStateError(
            "packing.check", packing["check"], _check(word, packing), "the anchor was altered, or is another order's"
        )
    return dict(packing)
