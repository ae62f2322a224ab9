"""The bin-packing rule shared by packed rows and token-budget batches: best-fit decreasing in one window.

One window's records are taken longest first; each goes into the open bin with the least room that
still takes it, or opens a bin. What "room" means is the only difference between the two costs:

- ``padded=False`` (a packed row, or a batch whose cost is its token sum): room is the capacity
  minus the tokens already in, and a record asks for its length.
- ``padded=True`` (a padded batch, cost = longest x count): records arrive longest first, so a
  bin's first record is its longest; room is the count still allowed, ``capacity // first - count``,
  and every record asks for 1.

Best fit keeps the open bins as a sorted list of rooms (``bisect``), O(log bins) to choose and a
short memmove to update per record: a few microseconds per record in CPython (docs/packing.md). Full
bins leave the list, so it holds only bins that can still take the shortest record.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


def pack_window(lengths: np.ndarray, capacity: int, *, padded: bool = False) -> list[np.ndarray]:
    """Bins of one window: each an array of indices into ``lengths`` (ascending), in the order the bins
    were opened (a bin's first record is the longest left at that time). Every index is in exactly one
    bin and each bin's cost is at most ``capacity``; every length must lie in [1, capacity].

    Example:
        >>> [bin.tolist() for bin in pack_window(np.array([5, 3, 4, 2]), 7)]
        [[0, 3], [1, 2]]
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    sizes = np.asarray(lengths, dtype=np.int64)[order].tolist()
    bins: list[list[int]] = []
    rooms: list[int] = []  # ascending; rooms[i] belongs to bins[owners[i]]
    owners: list[int] = []
    for index, size in zip(order, sizes):
        need = 1 if padded else size
        at = bisect_left(rooms, need)
        if at < len(rooms):
            owner = owners.pop(at)
            room = rooms.pop(at) - need
            bins[owner].append(index)
        else:
            owner = len(bins)
            bins.append([index])
            room = capacity // size - 1 if padded else capacity - size
        if room > 0:
            at = bisect_left(rooms, room)
            rooms.insert(at, room)
            owners.insert(at, owner)
    return [np.sort(np.array(members, dtype=np.int64)) for members in bins]


def bin_cost(lengths: np.ndarray, *, padded: bool = False) -> int:
    """What one bin costs: its token sum, or its longest record times its count when padded."""
    if not len(lengths):
        return 0
    return int(lengths.max()) * len(lengths) if padded else int(lengths.sum())


# bin_counts: the same bins counted for many windows at once, in NumPy lock-step (one visit to a bin of every window per
# step: a run of equal records put into the best-fit bin as many as it takes, ``_runs``), by one of two kernels. Any fit (best fit is one) leaves at most one bin at most half full: a later bin's
# first record would have fitted in it. So a window of token sum S opens at most 1 + (S - 1) // (capacity // 2 + 1)
# bins, its bound, and few bins fit a small row of rooms, one slot a bin (``_slot_counts``); many bins in a small
# capacity fit a table of room values better (``_table_counts``), whose cost does not grow with the bins.
_MAX_LOCK_STEP_TOKENS = 1 << 60  # capacity x window width: a window's tokens and its slots' codes stay in int64
_MAX_TABLE_CAPACITY = 1 << 15  # beyond it a window's room table outgrows the caches: the slots are faster
# bounds up to which the slots beat the table: CPU ms a log-normal window of 4096, slots / table, 0.16 / 0.23 at
# capacity 4096 (bound 506), 0.24 / 0.19 at 3072 (bound 674), 0.079 / 0.38 at 16384, 0.37 / 0.19 at 2048 (bound
# 1010) (``cases_packing kernels``, by runs of equal lengths)
_SLOT_LIMIT = 512
_MIN_VECTOR_WINDOWS = 32  # below it a lock-step's NumPy calls cost more than packing each window
_SLOT_CELLS = 1 << 20  # slots held at once (4 MiB of int32, twice: rooms and slack): windows per slot batch
_DONE_EVERY = 16  # lock-steps between two looks at whether every window has placed its records
# room counts held at once (5 MiB of uint16: 1280 windows at capacity 2048): windows per table batch. CPU us a log-normal
# window of 4096 at capacity 2048, by windows a batch: 272 at 1024, 258 at 1221, 386 at 1536, 385 at 2048 (more
# windows' counts leave the caches), 494 at 394 (each step's NumPy calls cost more than their work)
_TABLE_CELLS = 5 << 19
_ONE = np.int64(1)
_ALL = np.int64(-1)
_EXPONENT = np.int64(52)
_BIAS = np.int64(1023)
_BIT_COUNT = getattr(np, "bitwise_count", None)  # NumPy >= 2.0


def bin_counts(windows: np.ndarray, capacity: int, *, padded: bool = False) -> np.ndarray:
    """``len(pack_window(row, capacity, padded=padded))`` for every row of ``windows`` (one window's lengths a
    row, each in [1, capacity]), at a small fraction of the cost: an epoch's row count is a sum of these.

    Example:
        >>> bin_counts(np.array([[5, 3, 4, 2], [7, 7, 1, 1]]), 7).tolist()
        [2, 3]
    """
    windows = np.asarray(windows)
    if not windows.size:
        return np.zeros(len(windows), dtype=np.int64)
    if not padded and (len(windows) < _MIN_VECTOR_WINDOWS or capacity * windows.shape[1] >= _MAX_LOCK_STEP_TOKENS):
        return np.array([len(pack_window(row, capacity)) for row in windows], dtype=np.int64)
    # lengths are at most capacity: int32 when it fits (half the memory traffic of the lock-step's reads)
    narrow = windows.astype(np.int32 if capacity < (1 << 31) else np.int64, copy=False)
    if padded:
        return _padded_counts(np.sort(narrow, axis=1), capacity)  # np.sort copies: the caller's is kept
    bounds = _bin_bounds(narrow, capacity)
    slots = int(bounds.max())
    if slots <= _SLOT_LIMIT or capacity > _MAX_TABLE_CAPACITY:
        per_batch = even_batch(len(windows), max(1, _SLOT_CELLS // slots))
        return np.concatenate(
            [
                _slot_counts(narrow[at : at + per_batch], capacity, int(bounds[at : at + per_batch].max()))
                for at in range(0, len(windows), per_batch)
            ]
        )
    per_batch = even_batch(len(windows), max(1, _TABLE_CELLS // capacity))
    return np.concatenate(
        [_table_counts(narrow[at : at + per_batch], capacity) for at in range(0, len(windows), per_batch)]
    )


def even_batch(count: int, most: int) -> int:
    """The size of ``ceil(count / most)`` batches as equal as can be: a lock-step pays every one of its steps
    for each batch, so a last batch of a few windows would cost about as much as a full one.

    Example:
        >>> even_batch(2442, 2048), even_batch(4096, 2048), even_batch(5, 8)
        (1221, 2048, 5)
    """
    return -(-count // -(-count // most))


def _bin_bounds(windows: np.ndarray, capacity: int) -> np.ndarray:
    """The most bins best fit can open in each window: one a record, and all but one hold more than
    ``capacity // 2`` tokens."""
    tokens = windows.sum(axis=1, dtype=np.int64)
    return np.minimum((tokens - 1) // (capacity // 2 + 1) + 1, windows.shape[1])


def _padded_counts(ascending: np.ndarray, capacity: int) -> np.ndarray:
    """Padded bins never share a record: the only open bin is the last one opened (every record asks for 1, so
    the least room is any room), so a bin is the next ``capacity // first`` records of the window, longest first:
    read from the end of each sorted row (no reversed copy)."""
    count, width = ascending.shape
    flat = np.ascontiguousarray(ascending).reshape(-1)  # np.sort's rows are contiguous already: no copy
    start = np.arange(count, dtype=np.int64) * width
    position = start + (width - 1)  # each row's longest record
    bins = np.zeros(count, dtype=np.int64)
    live = np.arange(count)
    while live.size:
        position[live] -= capacity // flat[position[live]]
        bins[live] += 1
        live = live[position[live] >= start[live]]
    return bins


def _ctz(words: np.ndarray) -> np.ndarray:
    """The lowest set bit of each (nonzero) int64 word: the count of the ones below it (NumPy 2's bit count), or,
    before NumPy 2, the exponent of that bit alone, a power of two and so exact as a float64."""
    low = np.negative(words)
    low &= words
    if _BIT_COUNT is not None:
        low -= _ONE
        return _BIT_COUNT(low)  # type: ignore[no-any-return]
    exponent = low.view(np.uint64).astype(np.float64).view(np.int64)
    exponent >>= _EXPONENT
    exponent -= _BIAS
    return exponent


def _level_widths(capacity: int) -> list[int]:
    """Words per window at each level, the bottom first: level d is asked from bit p_d on, p_0 up to
    ``capacity`` and p_{d+1} = (p_d >> 6) + 1 (the words after p_d's), so each level has the words up to
    its last p_d's; the top level is one word."""
    widths = []
    position = capacity
    while True:
        widths.append((position >> 6) + 1)
        if widths[-1] == 1:
            return widths
        position = widths[-1]


def _reach(words: int) -> int:
    """A mask that keeps a word index below the next power of two of ``words``."""
    return (1 << (words - 1).bit_length()) - 1


def _runs(windows: np.ndarray, capacity: int, dtype: type) -> tuple[np.ndarray, ...]:
    """What both kernels step through, for the unpadded bins of the rows of ``windows`` (lengths in any order): each
    window's records as runs of equal lengths, longest first, and its records alone.

    A record longer than ``capacity // 2`` finds every open bin's room below it (the bin's first record is at least
    as long), so those records open one bin each and only put their rooms in (``alone_lengths``, in window
    ``alone_lanes``, the ``alone_ranks``-th of it). The rest go by runs: best fit puts the first record of a run of
    length s into the least room r >= s, and r - s, while at least s, is then the least room that fits, so that bin
    takes ``r // s`` of the run (or the run's rest) and the next least room the next ones. A kernel's step is one
    such visit a window: about 3x fewer steps than records for log-normal windows. Window i's runs are
    ``sizes[first[i] + 1 : last[i] + 1]`` with ``counts`` (ascending, so a window walks them from ``last`` down);
    ``first[i]`` is its sentinel, length 0 and count 0, where a window that placed every record stays, changing
    nothing."""
    count, width = windows.shape
    alone = windows > capacity // 2
    rest = np.zeros((count, width + 1), dtype=windows.dtype)  # column 0: every window's sentinel, sorted first
    rest[:, 1:] = windows
    any_alone = bool(alone.any())  # none for a budget of twice the longest record: no mask to apply nor to read
    if any_alone:
        rest[:, 1:][alone] = 0  # the records alone as 0: in the sentinel's run
    rest.sort(axis=1)
    flat = rest.reshape(-1)
    begins = np.empty(len(flat), dtype=bool)
    np.not_equal(flat[1:], flat[:-1], out=begins[1:])
    begins[:: width + 1] = True  # every window's first run, its sentinel
    starts = np.flatnonzero(begins)
    sizes: np.ndarray = flat[starts].astype(dtype)
    counts = np.diff(starts, append=len(flat))
    first = np.searchsorted(starts, np.arange(count, dtype=np.int64) * (width + 1))
    last = np.append(first[1:], len(starts)) - 1
    counts[first] = 0
    rows, columns = np.nonzero(alone) if any_alone else (np.zeros(0, dtype=np.intp),) * 2  # row-major: runs
    ranks = np.arange(len(rows)) - np.searchsorted(rows, rows)
    return sizes, counts, first, last, rows, ranks, windows[rows, columns]


class _Walk:
    """Each window's place in its runs (``_runs``): the length it places, as ``dtype`` (``need``, shifted left by
    ``shift``), its divisor (the length, 1 at the sentinel) and the records of the run still to place (``left``).
    A run's three are one row of ``runs``, so a step gathers each window's next run at once."""

    def __init__(self, sizes: np.ndarray, counts: np.ndarray, first: np.ndarray, last: np.ndarray, shift: int) -> None:
        self.dtype = sizes.dtype
        self.runs = np.stack([sizes.astype(np.int64) << shift, np.maximum(sizes, 1), counts], axis=1)
        self.first, self.at = first, last.copy()
        self.left = np.zeros(len(first), dtype=np.int64)
        self._read(np.ones(len(first), dtype=bool))

    def _read(self, moved: np.ndarray) -> None:
        need, self.divisor, count = np.take(self.runs, self.at, axis=0, mode="clip").T  # in range: not buffered
        self.need = need.astype(self.dtype)
        np.copyto(self.left, count, where=moved)

    def taken(self, room: np.ndarray) -> np.ndarray:
        """How many records of the run the visited bin takes, its room ``room`` (at least the length): ``room //
        length``, at most the run's rest (0 at the sentinel)."""
        taken = room // self.divisor
        np.minimum(taken, self.left, out=taken)
        self.left -= taken
        return taken

    def advance(self) -> None:
        """Windows whose run is placed go on to their next run (the sentinel stays)."""
        moved = self.left == 0
        self.at -= moved
        np.maximum(self.at, self.first, out=self.at)
        self._read(moved)

    def stop(self, lanes: np.ndarray) -> None:
        """Windows ``lanes`` place nothing more (the slots' fallback)."""
        self.at[lanes] = self.first[lanes]
        self.left[lanes] = 0

    def done(self, step: int) -> bool:
        """Whether every window has placed every record, looked at every ``_DONE_EVERY`` steps."""
        return step % _DONE_EVERY == 0 and not np.any(self.at != self.first)


def _slot_counts(windows: np.ndarray, capacity: int, slots: int) -> np.ndarray:
    """The unpadded bin count of each row of ``windows``, by best fit in lock-step over ``slots`` rooms a window
    (at least its bin bound, ``_bin_bounds``): a window's rooms are a column, so a step reads the first rows.

    A slot is its room and its index in one integer, ``room << shift | slot``, a slot not opened yet having room
    ``capacity``. A step is one visit a window (``_runs``): it subtracts the run's length from every slot, so a room
    that fits leaves room - length >= 0 and one that does not a negative number, huge as unsigned: the unsigned
    minimum is the best fit's slot (the least room that fits, an open bin before a new one; ties between equal rooms
    leave the same rooms, so the same count), which takes ``room // length`` of the run.
    Slots open in order (a new bin is the lowest slot not opened), so a step reads only the slots opened so far
    and one more. A record that finds no slot at all (the bound too low) makes its window packed alone, never a
    wrong count."""
    shift = max(1, (slots - 1).bit_length())
    full = capacity << shift  # a fitting slack is below it, a negative one (as unsigned) above it
    dtype, unsigned = (np.int32, np.uint32) if (capacity + 1) << shift < (1 << 31) else (np.int64, np.uint64)
    sizes, counts, first, last, alone_lanes, alone_ranks, alone_lengths = _runs(windows, capacity, dtype)
    walk = _Walk(sizes, counts, first, last, shift)
    count = len(windows)
    rooms = np.full((slots, count), full, dtype=dtype)
    rooms += np.arange(slots, dtype=dtype)[:, None]
    rooms[alone_ranks, alone_lanes] -= alone_lengths.astype(dtype) << shift
    flat = rooms.reshape(-1)
    lanes = np.arange(count, dtype=np.intp)
    slack = np.empty(slots * count, dtype=dtype)
    best = np.empty(count, dtype=unsigned)
    at = np.empty(count, dtype=np.intp)
    lost = np.zeros(count, dtype=bool)
    opened = int(np.bincount(alone_lanes, minlength=1).max())
    mask = (1 << shift) - 1
    step = 0
    while not walk.done(step):
        step += 1
        read = min(opened + 1, slots)
        fits = slack[: read * count].reshape(read, count)
        np.subtract(rooms[:read], walk.need, out=fits)
        np.minimum.reduce(fits.view(unsigned), axis=0, out=best)
        np.bitwise_and(best, mask, out=at)
        opened = max(opened, int(at.max()) + 1)
        if read == slots:  # every slot may be open: a record may find none
            stuck = best >= full
            if stuck.any():
                lost |= stuck
                walk.stop(np.flatnonzero(stuck))  # the bin it visits takes none
        # (room - length) << shift | slot, shifted right: room - length, and room // length = that // length + 1
        taken = walk.taken(np.right_shift(best, shift).astype(np.int64) + walk.divisor)
        at *= count
        at += lanes
        flat[at] -= (taken * walk.need).astype(dtype, copy=False)
        walk.advance()
    bins = (rooms < full).sum(axis=0).astype(np.int64)  # an open slot's room is below capacity
    for lane in np.flatnonzero(lost).tolist():
        bins[lane] = len(pack_window(windows[lane], capacity))
    return bins


def _table_counts(windows: np.ndarray, capacity: int) -> np.ndarray:
    """The unpadded bin count of each row of ``windows``, by best fit in lock-step over a room table.

    A window's rooms are a multiset of integers in [0, capacity]: a count per value, and above it one bitmap per
    64x (bit v of a level: value v of the level below is present), so "the smallest room >= need" is a few word
    operations per window, whatever the number of open bins. Room ``capacity`` is a new bin: always present (its
    count never reaches 0), so every query finds a room and every step is the same operations; room 0, a full bin,
    is asked for only by a window that placed every record (its sentinel asks for 0, takes none and puts the same
    room back). A step is one visit a window (``_runs``): the room found takes ``room // length`` of the run. The words are int64 (bit 63 the sign bit): shifts and masks stay in one dtype. A window's
    bins are its rooms at the end (a full bin's room is 0), the always-present room ``capacity`` aside."""
    count, width = windows.shape
    sizes, counts, first, last, rows, _, alone_lengths = _runs(windows, capacity, np.int64)
    walk = _Walk(sizes, counts, first, last, 0)
    values = capacity + 1
    new_bin = width + 1  # the count of room ``capacity``: more than the bins a row can open
    table = np.zeros((count, values), dtype=np.uint16 if new_bin < (1 << 16) else np.int64)  # rooms of a value
    np.add.at(table, (rows, capacity - alone_lengths), 1)
    table[:, capacity] = new_bin
    widths = _level_widths(capacity)
    present = table > 0
    levels = []
    for level_width in widths:
        bits = np.zeros((count, level_width * 64), dtype=bool)
        bits[:, : present.shape[1]] = present
        packed = np.packbits(bits, axis=1, bitorder="little").view("<i8").astype(np.int64)
        levels.append(np.concatenate([packed.reshape(-1), np.zeros(_reach(level_width) + 1, dtype=np.int64)]))
        present = packed != 0
    reaches = [_reach(level_width) for level_width in widths]
    rooms = table.reshape(-1)
    bases = [np.arange(count, dtype=np.int64) * level_width for level_width in widths]
    room_base = np.arange(count, dtype=np.int64) * values
    top, top_words = len(widths) - 1, levels[-1]
    step = 0
    while not walk.done(step):
        step += 1
        need, tops = walk.need, top_words[:count]  # one word a row: a slice, no gather
        # up: at each level the word holding p_d, its bits from p_d on
        position = need
        quotients, masked = [], []
        for depth in range(top):
            quotient = position >> 6
            word = levels[depth][bases[depth] + quotient]
            word &= _ALL << (position & 63)
            quotients.append(quotient)
            masked.append(word)
            position = quotient + 1
        index = _ctz(tops & (_ALL << position))
        word, bit = tops, index  # top == 0: the room is the top word's bit, and ``word`` the top words themselves
        # down from the top: the lowest level with a hit holds the answer; below it, each word's lowest bit. Above
        # that level the words may be empty (a room below p_d's word), their "lowest bit" garbage: masked to a
        # word index in bounds, read, and discarded where the level below hits
        for depth in range(top - 1, -1, -1):
            hit = masked[depth] != 0
            quotient = np.where(hit, quotients[depth], index & reaches[depth])
            cell = bases[depth] + quotient
            word = levels[depth][cell]
            bit = _ctz(np.where(hit, masked[depth], word))
            index = (quotient << 6) + bit
        room = index
        taken = walk.taken(room)
        # one room ``room`` out: a bit goes when its count does, a word's bit above when the word empties
        at = room_base + room
        kept = rooms[at] - 1
        rooms[at] = kept
        cleared = kept == 0
        word ^= np.left_shift(cleared, bit, dtype=np.int64)
        if top:
            levels[0][cell] = word
            value = room >> 6
            for depth in range(1, top):
                cleared &= word == 0
                at = bases[depth] + (value >> 6)
                word = levels[depth][at]
                word ^= np.left_shift(cleared, value & 63, dtype=np.int64)
                levels[depth][at] = word
                value >>= 6
            cleared &= word == 0
            tops ^= np.left_shift(cleared, value, dtype=np.int64)
        # room - taken x length in
        value = room - taken * need
        rooms[room_base + value] += 1
        for depth in range(top):
            levels[depth][bases[depth] + (value >> 6)] |= _ONE << (value & 63)
            value >>= 6
        tops |= _ONE << value
        walk.advance()
    return table[:, :capacity].sum(axis=1, dtype=np.int64)  # type: ignore[no-any-return]
