"""Rows of packed records as a strategy: pass p's positions are its rows, each a pure function of (seed, p, row).

A row is a list of ``(record, start, stop)`` token slices. Two rules make rows out of a pass's
windows (``windows.py``):

- ``split=True`` (pre-training, ``concat``): the records of the shuffle are concatenated and the
  token stream is cut every ``capacity`` tokens. Pass p has ceil(T / capacity) rows for T tokens in
  all, every pass alike; row j is the tokens [j*capacity, (j+1)*capacity) of the stream, found from
  the start of the window that holds token j*capacity.
- ``split=False`` (fine-tuning, ``pack``; token-budget batches): each window's records are packed
  whole by best-fit decreasing (``packing.py``), and the window's bins, in an order drawn from
  (seed, pass, window), are its rows. A window's row count is known only once it is packed, so the
  pass's row count is a sum over all its windows: paid once per pass, counted for every window at once
  in NumPy (``packing.bin_counts``, tens of nanoseconds a record instead of microseconds for packing
  each window), or read from a saved state, which carries it. A window's rows themselves are packed
  when the window is read, O(window).

The sampler strides through rows exactly as through records, so tails, ranks, elastic resume and
keys are the sampler's. A saved state adds an *anchor*: the window of the saved row and where that
window starts (and the pass's row count), so a resume finds the rows it continues with in O(window).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.lengths import MAX_TOKENS, legacy_lengths_digest, lengths_digest
from stateful_sampler.order.packing import bin_counts, even_batch, pack_window
from stateful_sampler.order.strategy import PassOrder, SavedOrder, Strategy, Uniform, check_length
from stateful_sampler.order.windows import PassWindows, WindowCache, WindowStarts

Slice = tuple[int, int, int]  # (record, start, stop): tokens [start, stop) of the record
_KEPT_PASSES = 3  # carry reads across one pass boundary; a state probe may ask for the previous pass
_COUNTED_AT_ONCE = 1 << 23  # records whose windows' rows are counted together: ~100 MB of temporaries
# draws from which a pass's rows are counted in a thread while its first rows are served (``PassRows.counting_floor``):
# below it the count takes a few ms, less than a thread's start and its contention for the GIL
_COUNTED_LATER = 1 << 18
SPLICE_VERSION = 1  # the version of a row order's slot in a saved state (``state_at``)
_SPLICE_FIELDS = ("version", "splice", "rows", "fingerprint", "drawn")


class RowOrder(Strategy):
    """Rows of ``capacity`` tokens (or batches of cost at most ``capacity``) over windows of the shuffle.

    Args:
        lengths: tokens per record, each at least 1 and all of them at most 2**62 - 1 (``lengths.MAX_TOKENS``,
            checked by the caller: ``lengths.token_lengths``), so every offset below stays within int64.
        capacity: tokens per row (``seq_len``), or the batch budget (``max_tokens``), at most 2**62 - 1.
        seed: the sampler's seed (a pass's row count depends on it).
        split: concatenate and cut (``True``), or pack whole records (``False``).
        window: shuffle positions per window.
        padded: the cost of a bin is its longest record times its count (token-budget batches).
        truncate: with ``split=False``, records longer than ``capacity`` keep their first tokens.
        strategy: the order whose draws are packed (``None``: this module's uniform shuffle, as before there
            was a choice). Its pass p is ``strategy.pass_order(N, seed, p)``, exactly the order a
            ``StatefulSampler`` with that strategy reads; a record drawn twice is packed twice.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        capacity: int,
        *,
        seed: int,
        split: bool,
        window: int,
        padded: bool = False,
        truncate: bool = False,
        name: str = "packed-rows",
        strategy: Strategy | None = None,
    ) -> None:
        self.name = name  # type: ignore[misc]
        self.lengths = lengths
        self.capacity = capacity
        self.seed = seed
        self.split = split
        self.window = window
        self.padded = padded
        self.truncate = truncate
        self.drawn = strategy  # None: the uniform shuffle of windows.py
        self.passes_vary = not split or strategy is not None  # a strategy's passes may draw other tokens
        self.tokens = int(lengths.sum(dtype=np.int64))
        self._kept_tokens: int | None = None  # ``kept_tokens``, once asked
        self.digest = lengths_digest(lengths)  # of the values: what a state records as its lengths
        self._legacy_digest: str | None = None
        self._passes: OrderedDict[int, PassRows] = OrderedDict()
        self._saved_rows: dict[int, int] = {}  # a continuation's saved pass: its row count in the saved run
        self._resumed: tuple[Any, RowOrder | None] | None = None  # the last continuation built, by its state

    def __repr__(self) -> str:
        mode = "split" if self.split else ("padded" if self.padded else "whole")
        return f"RowOrder(<{len(self.lengths)} lengths>, capacity={self.capacity}, {mode}, window={self.window})"

    def check(self, size: int) -> None:
        check_length("lengths", self.lengths, size)

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.rows(pass_index).count()

    def counting_floor(self, size: int, pass_index: int) -> int | None:
        return self.rows(pass_index).counting_floor()

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        return _rows_themselves

    # -- a changed strategy at a resume: the pass spliced at the end of the saved window

    def state_at(self, pass_index: int, offset: int, kept_from: int | None = None) -> dict[str, Any] | None:
        """The packed strategy's slot (None: it keeps none, as ``Uniform`` or ``Weighted``), taken at the *splice*:
        the end of the window holding row ``offset`` (its start when none of it was read; the pass's end once its
        rows are all read), with the pass up to there kept as it is (``kept_from=0``). A strategy continuing the state (a ``Mixture`` with
        ``on_change="continue"``) draws the saved run's records up to the splice, so the window in progress keeps
        its rows and every window before it its row count, and its own from the splice on; the pass's later
        rows are counted from that order. Also the saved pass's row count (``saved_pass_length``)."""
        if self.drawn is None:
            return None
        rows = self.rows(pass_index)
        count, length = rows.count(), rows.draws
        if offset >= count:
            splice = length  # only padding is left: the next pass changes
        else:
            window, start = rows.anchor(offset)
            begun = start < (offset * self.capacity if self.split else offset)  # some of the window is read
            splice = min((window + begun) * self.window, length)
        slot = self.drawn.state_at(pass_index, splice, kept_from=0)
        if slot is None:
            return None
        fingerprint = self.drawn.fingerprint()
        return {"version": SPLICE_VERSION, "splice": splice, "rows": count, "fingerprint": fingerprint, "drawn": slot}

    def resume_from(self, saved: SavedOrder) -> RowOrder | None:
        """This order with the packed strategy's continuation of the saved one (``Strategy.resume_from``, given
        the saved slot at the splice), or None when the packed strategy continues only its own order. Built
        once per state: a row sampler asks before the sampler does."""
        if self.drawn is None or saved.state is None:
            return None
        key = (saved.size, saved.fingerprint, saved.pass_index, json.dumps(saved.state, sort_keys=True, default=str))
        if self._resumed is not None and self._resumed[0] == key:
            return self._resumed[1]
        state = _checked_splice(saved.state)
        drawn = self.drawn.resume_from(
            SavedOrder(saved.size, self.drawn.name, state["fingerprint"], state["drawn"], saved.pass_index,
                       state["splice"])
        )  # fmt: skip
        continued = None
        if drawn is not None and drawn is not self.drawn:
            continued = copy.copy(self)
            continued.__dict__.pop("_fingerprint", None)
            continued.drawn = drawn
            continued._passes = OrderedDict()
            continued._saved_rows = {saved.pass_index: state["rows"]}
            continued._resumed = None
        self._resumed = (key, continued)
        return continued

    def saved_pass_length(self, size: int, pass_index: int) -> int:
        if pass_index in self._saved_rows:
            return self._saved_rows[pass_index]
        return self.pass_length(size, pass_index)

    def _identity(self) -> tuple[Any, ...]:
        identity = (self.digest, len(self.lengths), self.capacity, self.split, self.window, self.padded, self.truncate)
        if self.drawn is None:
            return identity  # the fingerprint of the orders saved before strategies could be packed
        return (*identity, *strategy_setting(self.drawn))

    @contextmanager
    def hashed_as_before(self, legacy: bool) -> Iterator[None]:
        """While in force (``legacy``), ``digest``, and with it the fingerprint, is the blake2b digest that states
        saved before packing anchor version 3 recorded: paid (once) only to load such a state."""
        if not legacy:
            yield
            return
        if self._legacy_digest is None:
            self._legacy_digest = legacy_lengths_digest(self.lengths)
        digest, self.digest = self.digest, self._legacy_digest
        self.__dict__.pop("_fingerprint", None)
        try:
            yield
        finally:
            self.digest = digest
            self.__dict__.pop("_fingerprint", None)

    def kept_tokens(self) -> int:
        """Tokens of the records once each, as rows keep them (``truncate`` keeps ``capacity`` of a longer one)."""
        if self._kept_tokens is None:
            kept = np.minimum(self.lengths, self.capacity).sum(dtype=np.int64) if self.truncate else self.tokens
            self._kept_tokens = int(kept)
        return self._kept_tokens

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its passes' rows (a cache, rebuilt where they are read again): a sampler that has
        been iterated, or asked its length, still goes to spawned processes."""
        state = dict(self.__dict__)
        state["_passes"] = OrderedDict()
        return state

    def draws(self, pass_index: int) -> tuple[int, PassOrder | None]:
        """Pass ``pass_index``'s draws: how many, and the records at its positions (``None``: the uniform
        shuffle). A pass whose tokens could pass ``MAX_TOKENS`` is refused (its offsets would wrap int64)."""
        size = len(self.lengths)
        if self.drawn is None:
            return size, None
        length = self.drawn.pass_length(size, pass_index)
        if length and int(self.lengths.max()) * length > MAX_TOKENS:
            raise ValueError(
                f"strategy {self.drawn!r} draws {length} records in pass {pass_index}: with records of up to "
                f"{int(self.lengths.max())} tokens its tokens may pass 2**62 - 1 (int64 offsets): draw fewer"
            )
        return length, self.drawn.pass_order(size, self.seed, pass_index)

    def rows(self, pass_index: int) -> PassRows:
        """Pass ``pass_index``'s rows (the last few passes are kept)."""
        rows = self._passes.get(pass_index)
        if rows is None:
            rows = self._passes[pass_index] = PassRows(self, pass_index)
            if len(self._passes) > _KEPT_PASSES:
                self._passes.popitem(last=False)
        return rows


def strategy_setting(strategy: Strategy) -> tuple[str, str]:
    """A packed strategy as a saved state records it: its name (``uniform(shuffle=False)`` for the identity
    order, whose fingerprint is a shuffled Uniform's) and its fingerprint."""
    name = "uniform(shuffle=False)" if isinstance(strategy, Uniform) and not strategy.shuffle else strategy.name
    return name, strategy.fingerprint()


def _checked_splice(state: Any) -> dict[str, Any]:
    """A row order's saved slot, refused naming the field unless it is exactly a version 1 slot."""
    if not isinstance(state, Mapping) or set(state) != set(_SPLICE_FIELDS):
        keys = sorted(state) if isinstance(state, Mapping) else state
        raise IncompatibleStateError("strategy_state", keys, list(_SPLICE_FIELDS), "not a row order's state")
    if state["version"] != SPLICE_VERSION:
        raise IncompatibleStateError("strategy_state.version", state["version"], SPLICE_VERSION, "unknown version")
    for name in ("splice", "rows"):
        if type(state[name]) is not int or state[name] < 0:
            raise IncompatibleStateError(f"strategy_state.{name}", state[name], "a non-negative int")
    if not isinstance(state["fingerprint"], str):
        raise IncompatibleStateError("strategy_state.fingerprint", state["fingerprint"], "a str")
    return dict(state)


def _rows_themselves(positions: np.ndarray) -> np.ndarray:
    return positions


class PassRows:
    """One pass's rows: built window by window from the nearest known window start."""

    def __init__(self, order: RowOrder, pass_index: int) -> None:
        self._order = order
        length, draws = order.draws(pass_index)
        self.draws = length  # positions of the packed strategy's pass
        self._windows = PassWindows(length, order.window, order.seed, pass_index, draws)
        if order.split:
            self._built: WindowCache[Any] = WindowCache(self._concat_window)
            if draws is None:
                self.starts = WindowStarts(self._windows.count, lambda index: self._built(index)[2][-1])
                self.starts.remember(self._windows.count, order.tokens)
            else:  # a strategy's pass: its tokens are a sum over its draws, every window's at once
                self.starts = WindowStarts(
                    self._windows.count, lambda index: self._built(index)[2][-1], self._tokens_of_every_window
                )
        else:
            self._built = WindowCache(self._packed_window)
            self.starts = WindowStarts(
                self._windows.count, lambda index: len(self._built(index)), self._rows_of_every_window
            )

    def count(self) -> int:
        """Rows in the pass."""
        if self._order.split:
            return -(-self.starts.total() // self._order.capacity)
        return self.starts.total()

    def counting_floor(self) -> int | None:
        """None where the pass's row count is known or cheap; else the count starts in the background
        (``WindowStarts.count_in_background``) and this is a floor of the rows the pass surely has. Every window
        packs into at least one row, and into at least ceil(tokens / capacity) rows of at most ``capacity``
        tokens (a padded batch costs at least its tokens), where the pass's tokens are known: a shuffle's."""
        if self._order.split or self.draws < _COUNTED_LATER or not self.starts.count_in_background():
            return None
        floor = self._windows.count
        if self._order.drawn is None:  # the uniform shuffle: every record once
            floor = max(floor, -(-self._order.kept_tokens() // self._order.capacity))
        return floor

    def saved_total(self) -> int | None:
        """What a state carries so that a resume never walks the pass: its units (rows, or tokens of a
        strategy's split pass) when only a walk over every window finds them, else ``None``."""
        if self._order.split and self._order.drawn is None:
            return None
        return self.starts.total()

    def has_row(self, row: int) -> bool:
        """Whether the pass has a row ``row``: a walk over the windows up to it at most, as reading it costs."""
        if row < 0:
            return False
        known = self.count() if self._order.split else self.starts.known_total()
        if known is not None:
            return row < known
        try:
            self.starts.locate(row)
        except IndexError:  # the walk passed the last window: the pass's row count is known now
            return False
        return True

    def anchor(self, row: int) -> tuple[int, int]:
        """The window where ``row`` begins and that window's start (in tokens, or rows)."""
        return self.starts.locate(row * self._order.capacity if self._order.split else row)

    def row(self, row: int) -> list[Slice]:
        """Row ``row`` as token slices."""
        if not self._order.split:
            index, start = self.starts.locate(row)
            records = self._built(index)[row - start]
            return [(record, 0, self._kept(record)) for record in records.tolist()]
        capacity, tokens = self._order.capacity, self.starts.total()
        first = row * capacity
        last = min(first + capacity, tokens)
        slices: list[Slice] = []
        while first < last:
            index, start = self.starts.locate(first)
            records, ends, end_list = self._built(index)
            at = int(np.searchsorted(ends, first - start, side="right"))
            while at < len(records) and first < last:
                record_start = start + (end_list[at - 1] if at else 0)
                stop = min(last, start + end_list[at])
                slices.append((records[at], first - record_start, stop - record_start))
                first = stop
                at += 1
        return slices

    def batch(self, row: int) -> list[int]:
        """Row ``row``'s records (a token-budget batch)."""
        index, start = self.starts.locate(row)
        return self._built(index)[row - start].tolist()

    def _kept(self, record: int) -> int:
        length = int(self._order.lengths[record])
        return min(length, self._order.capacity) if self._order.truncate else length

    def _concat_window(self, index: int) -> tuple[list[int], np.ndarray, list[int]]:
        records = self._windows.records(index)
        ends = np.cumsum(self._order.lengths[records], dtype=np.int64)
        return records.tolist(), ends, ends.tolist()

    def _tokens_of_every_window(self) -> np.ndarray:
        """Each window's tokens (a strategy's split pass), many windows at a time: O(pass) in NumPy."""
        windows, window = self._windows, self._windows.window
        counts = np.empty(windows.count, dtype=np.int64)
        per_batch = max(1, _COUNTED_AT_ONCE // window)
        for first in range(0, windows.count, per_batch):
            last = min(first + per_batch, windows.count)
            lengths = windows.lengths_between(self._order.lengths, first, last).astype(np.int64, copy=False)
            counts[first:last] = np.add.reduceat(lengths, np.arange(0, len(lengths), window))
        return counts

    def _rows_of_every_window(self) -> np.ndarray:
        """Each window's row count, the windows' lengths counted many windows at a time (``bin_counts``):
        exactly ``len(self._packed_window(index))`` for every index."""
        order, windows = self._order, self._windows
        counts = np.empty(windows.count, dtype=np.int64)
        full = windows.size // windows.window  # windows of ``window`` records; the last may be shorter
        per_batch = even_batch(windows.count, max(1, _COUNTED_AT_ONCE // windows.window))
        for first in range(0, windows.count, per_batch):
            last = min(first + per_batch, windows.count)
            lengths = windows.lengths_between(order.lengths, first, last)
            if order.truncate:
                lengths = np.minimum(lengths, order.capacity)
            whole = min(last, full) - first
            cut = whole * windows.window
            counts[first : first + whole] = bin_counts(
                lengths[:cut].reshape(whole, windows.window), order.capacity, padded=order.padded
            )
            if cut < len(lengths):
                counts[last - 1] = bin_counts(lengths[None, cut:], order.capacity, padded=order.padded)[0]
        return counts

    def _packed_window(self, index: int) -> list[np.ndarray]:
        order = self._order
        records = self._windows.records(index)
        lengths = order.lengths[records].astype(np.int64)
        if order.truncate:
            np.minimum(lengths, order.capacity, out=lengths)
        bins = pack_window(lengths, order.capacity, padded=order.padded)
        shuffled = self._windows.rng(index).permutation(len(bins))
        return [records[bins[at]] for at in shuffled.tolist()]
