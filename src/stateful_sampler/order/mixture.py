"""``Mixture``: several datasets drawn at set weights, each walking its own reshuffled passes.

The data is a ``ConcatDataset``: source d owns records [offset_d, offset_d + sizes[d]). The stream
of draws runs on across epochs (epoch e holds stream positions e*num_samples ... (e+1)*num_samples - 1);
which source each stream position takes is the quota interleave of ``quota.py``, so at every prefix
of the stream each source's count is within 1 of its target share. Source d's k-th draw is record
k % size_d of its source-epoch k // size_d, a permutation of its own seeded by (seed, d, source-epoch):
a small source repeats, reshuffled each time; a large one continues where the last epoch stopped.

``on_change="continue"`` lets a state saved under another mixture (other weights, other schedule entries
after the saved position, sources appended) continue from its saved stream position S with this mixture's
weights: ``resume_from`` returns this mixture *continued at S*, whose sources have drawn what the state
records at S (``state_at``: each source's draws, O(sources)) and whose interleave restarts there. The
continued mixture's fingerprint holds S and those draws, and every later state records them again, so a
resume from a later checkpoint rebuilds the same continued mixture from this one. Stream positions before
S were drawn under the saved mixture, whose weights the state does not keep (it stays O(sources)): the
continued mixture refuses passes before S's and, inside S's pass, answers the positions before S (which
only the padding that evens out ranks reads again) as this mixture's own.

``schedule`` changes the weights from given stream positions on: a key ``e`` is (e, 0), a key
``(e, position)`` is stream position e*num_samples + position. The stream restarts its interleave at
each change (the prefix bound holds from the start of each constant-weight segment), while every
source's draws continue: no record of a source-epoch is drawn twice or skipped because the weights
moved. The draws before each segment are counted once at construction (O(Q) per segment), so a resume
is O(1).
"""

from __future__ import annotations

import copy
import hashlib
from bisect import bisect_right
from collections.abc import Mapping
from functools import cached_property
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from stateful_sampler.checks import check_int
from stateful_sampler.errors import IncompatibleStateError
from stateful_sampler.order.mixing import Domain, derive_seed, mix64_array
from stateful_sampler.order.permutation import MAX_SIZE
from stateful_sampler.order.quota import quota_period, rational_weights
from stateful_sampler.order.ragged import RaggedPermutation
from stateful_sampler.order.strategy import PassOrder, SavedOrder, Strategy, id_array, weight_array

_TAG = 0x4D495854  # "MIXT": this module's seeds
_MAX_STREAM = 1 << 62  # stream positions and draw numbers stay int64
ON_CHANGE = ("refuse", "continue")
SLOT_VERSION = 1  # the version of the mixture's slot in a saved state (``state_at``)
# 2 adds the pieces of the pass a continuation keeps (``held``: this mixture's own, ``kept``: asked for by
# ``kept_from``); written only when there are some, so a state without them is version 1, as before.
_SLOT_FIELDS = {
    1: ("version", "num_samples", "change", "draws", "sizes", "sizes_digest"),
    2: ("version", "num_samples", "change", "draws", "sizes", "sizes_digest", "held", "kept"),
}
_CHECK_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"  # 6 bits of a source's size


class Mixture(Strategy):
    """Epochs of ``num_samples`` draws from D concatenated sources at ``weights``.

    Args:
        sizes: records per source (all positive), in ``ConcatDataset`` order.
        weights: one non-negative weight per source, not all zero; normalised. Integers summing to at
            most 2**20 are exact ratios; other weights are rounded to millionths (``weights_at`` shows
            the ones used, against which the prefix bound is exact).
        num_samples: the epoch length (required: a mixture has no natural one).
        schedule: ``{key: weights}``: from that key on (until the next entry), these weights; a key is
            an epoch ``e`` (its start) or a pair ``(e, position)`` with ``0 <= position < num_samples``.
        on_change: ``"refuse"`` (default): a state saved under another mixture is refused; ``"continue"``:
            it continues from its saved position with this mixture's weights (sources may be appended
            after the saved ones; a removed source keeps its place with weight 0).

    Example:
        >>> mixture = Mixture([4, 6], [1, 1], num_samples=10, schedule={(0, 6): [1, 0]})
        >>> mixture.locate(0, np.arange(10))[0].tolist()
        [0, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    """

    name = "mixture"
    keeps_fingerprints = True  # a MixedStream builds its mixture at every resume: the fingerprint once per weights

    def __init__(
        self,
        sizes: Any,
        weights: Any,
        *,
        num_samples: int,
        schedule: Mapping[Any, Any] | None = None,
        on_change: str = "refuse",
    ) -> None:
        if on_change not in ON_CHANGE:
            raise ValueError(f"on_change must be one of {list(ON_CHANGE)}, got {on_change!r}")
        self.on_change = on_change
        self._own: Mixture = self  # the mixture as built: a continued one answers from it before its change
        self.change: int | None = None  # the stream position this mixture continues a saved run from
        self.sizes = id_array("sizes", sizes)
        empty = np.flatnonzero(self.sizes == 0)
        if not self.sizes.size or empty.size:
            where = f"source {int(empty[0])} has 0 records" if empty.size else "no sources"
            raise ValueError(f"sizes must hold at least one source, each of at least 1 record, got {where}")
        total = sum(self.sizes.tolist())  # Python ints: a sum past int64 would wrap to another total
        if total >= MAX_SIZE:
            raise ValueError(f"sizes must add up to fewer than 2**62 records (a dataset's N), got {total}")
        # an epoch's draws are positions of one stream of 2**62 (the sampler's): refused here, not at the first iter()
        self.num_samples = check_int("num_samples", num_samples, minimum=1, maximum=MAX_SIZE - 1)
        self.offsets = np.cumsum(self.sizes) - self.sizes
        changes: dict[int, tuple[Any, Any]] = {}  # stream position -> (the key as given, its weights)
        for key, value in dict(schedule or {}).items():
            start = self._stream_position(key)
            if start in changes:
                raise ValueError(
                    f"schedule keys must be distinct stream positions, got {changes[start][0]!r} and {key!r} "
                    f"(both stream position {start})"
                )
            changes[start] = (key, value)
        self._starts = [0, *sorted(changes)]  # stream positions where each constant-weight segment starts
        self._origins = list(self._starts)  # where each segment's interleave starts: a held piece's may be earlier
        self._held: list[Piece] = []  # the saved run's pieces this continued mixture keeps before its change
        self._keys = [0, *(self._label(start) for start in self._starts[1:])]
        given = [weights, *(changes[start][1] for start in self._starts[1:])]
        names = ["weights", *(f"schedule[{changes[start][0]!r}]" for start in self._starts[1:])]
        self._periods = [
            quota_period(rational_weights(name, self._per_source(name, w))) for name, w in zip(names, given)
        ]
        self._draws_before = self._segment_draws()

    @cached_property
    def _permutations(self) -> RaggedPermutation:
        """Each source's permutations of its records, one per source-epoch: set up at the first pass drawn through
        this mixture, not at its build (a ``MixedStream`` builds one at every resume and draws its sources' own
        orders). A continued mixture shares those of the mixture as built, set up once for all its continuations."""
        own = self._own
        return RaggedPermutation(self.sizes) if own is self else own._permutations

    def _stream_position(self, key: Any) -> int:
        """A schedule key's stream position: ``e`` is (e, 0); ``(e, position)`` is e*num_samples + position."""
        if isinstance(key, tuple):
            integral = all(isinstance(v, Integral) and not isinstance(v, bool) for v in key)
            if len(key) != 2 or not integral or key[0] < 0 or not 0 <= key[1] < self.num_samples or key == (0, 0):
                raise ValueError(
                    f"schedule keys must be an epoch >= 1 or a pair (epoch, position) of non-negative ints with "
                    f"position < num_samples = {self.num_samples}, not (0, 0), got {key!r}"
                )
            epoch, position = int(key[0]), int(key[1])
        else:
            epoch, position = check_int("schedule epoch", key, minimum=1), 0
        start = epoch * self.num_samples + position
        if start >= _MAX_STREAM:
            raise ValueError(f"schedule keys must sit below stream position 2**62, got {key!r}")
        return start

    def _label(self, start: int) -> int | tuple[int, int]:
        """A segment start as the fingerprint names it: its epoch when it starts one (as before pairs
        existed, so those fingerprints are unchanged), else (epoch, position)."""
        epoch, position = divmod(start, self.num_samples)
        return epoch if position == 0 else (epoch, position)

    def _per_source(self, name: str, weights: Any) -> np.ndarray:
        array = weight_array(name, weights)
        if len(array) != len(self.sizes):
            raise ValueError(f"{name} must have one entry per source: {len(self.sizes)} sources, got {len(array)}")
        with np.errstate(over="ignore"):
            overflows = not np.isfinite(array.sum())
        if overflows:
            array = array / array.max()  # the same ratios, with a sum that does not overflow
        return array

    def _segment_draws(self) -> list[np.ndarray]:
        """Each source's draws before each constant-weight segment: the counts carried across a change."""
        draws = [np.zeros(len(self.sizes), dtype=np.int64)]
        for index in range(1, len(self._starts)):
            length = self._starts[index] - self._starts[index - 1]
            draws.append(draws[-1] + self._periods[index - 1].counts_before(length))
        return draws

    def __repr__(self) -> str:
        changed = "" if self.change is None else f", continued at {divmod(self.change, self.num_samples)}"
        return f"Mixture(<{len(self.sizes)} sources>, num_samples={self.num_samples}{changed})"

    def weights_at(self, epoch: int, position: int = 0) -> np.ndarray:
        """The normalised weights at ``position`` of epoch ``epoch`` (exactly those the prefix bound refers to)."""
        counts = self._periods[self._known_segment(epoch * self.num_samples + position)].counts
        return counts / counts.sum()

    def segment_starts(self) -> list[tuple[int, int]]:
        """Each constant-weight segment's first (epoch, position), in stream order (a continued mixture's
        from its change on: the saved run's segments before it are not in the state)."""
        known = self._starts if self.change is None else self._starts[1 + len(self._held) :]
        return [divmod(start, self.num_samples) for start in known]

    def segment_start(self, epoch: int) -> int:
        """The first epoch of the constant-weight segment holding ``epoch``, for schedules whose segments
        start at epochs; a change inside an epoch is refused (``segment_starts`` gives positions)."""
        segment = self._known_segment(epoch * self.num_samples)
        inside = bisect_right(self._starts, (epoch + 1) * self.num_samples - 1) != segment + 1
        first, position = divmod(self._starts[segment], self.num_samples)
        if position or inside:
            raise ValueError(
                f"epoch {epoch} of this mixture has no single epoch-aligned segment: a schedule key is a pair "
                "(epoch, position); use segment_starts()"
            )
        return first

    def draws_before(self, epoch: int, position: int = 0) -> np.ndarray:
        """How many times each source was drawn before ``position`` of epoch ``epoch`` (O(Q))."""
        return self._draws_at(epoch * self.num_samples + position)

    def _draws_at(self, stream: int) -> np.ndarray:
        segment = self._known_segment(stream)
        return self._draws_before[segment] + self._periods[segment].counts_before(stream - self._origins[segment])

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, that source's draw number) at positions of an epoch: what the audit counts. Each
        position's segment is found on its stream position, so a change inside the epoch is honoured."""
        positions = np.asarray(positions, dtype=np.int64)
        stream = positions + epoch * self.num_samples
        segments = np.searchsorted(self._starts, stream, side="right") - 1
        sources = np.empty(stream.shape, dtype=np.int64)
        draws = np.empty(stream.shape, dtype=np.int64)
        # The segments present, ascending; not np.unique, whose first call imports numpy.ma (0.1 s of a first resume).
        for segment in np.flatnonzero(np.bincount(segments)).tolist():  # few: a block spans few changes
            at = segments == segment
            if self.change is not None and segment == 0:  # before the change: this mixture's own order
                sources[at], draws[at] = self._own.locate(epoch, positions[at])
                continue
            found, drawn = self._periods[segment].locate(stream[at] - self._origins[segment])
            sources[at], draws[at] = found, drawn + self._draws_before[segment][found]
        return sources, draws

    def _segment(self, stream: int) -> int:
        return bisect_right(self._starts, stream) - 1

    def _known_segment(self, stream: int) -> int:
        """The segment of a stream position whose weights and draws this mixture knows: a continued
        mixture refuses one before its change, drawn under the saved mixture."""
        segment = self._segment(stream)
        if self.change is not None and segment == 0:
            raise ValueError(self._before_change(stream))
        return segment

    def _before_change(self, stream: int) -> str:
        return (
            f"stream position {divmod(stream, self.num_samples)} (epoch, position) lies before this mixture's "
            f"change at {divmod(self.change or 0, self.num_samples)}: it was drawn under the saved run's mixture, "
            f"whose weights the state does not keep"
        )

    def check(self, size: int) -> None:
        total = sum(self.sizes.tolist())
        if total != size:
            raise ValueError(f"sizes must add up to the dataset's N = {size}, got {total}")

    def pass_length(self, size: int, pass_index: int) -> int:
        return self.num_samples

    def pass_order(self, size: int, seed: int, pass_index: int) -> PassOrder:
        if (pass_index + 1) * self.num_samples > _MAX_STREAM:
            raise ValueError(f"epoch times num_samples must stay below 2**62, got epoch {pass_index}")
        if self.change is not None and (pass_index + 1) * self.num_samples <= self._starts[1]:
            raise ValueError(f"epoch {pass_index}: {self._before_change(pass_index * self.num_samples)}")
        return _MixturePass(self, seed, pass_index)

    def mismatch_hint(self) -> str:
        return (
            "a Mixture's sizes, weights, num_samples and schedule are its identity: to continue the saved run "
            "with this mixture's weights (or with sources appended), build it with on_change='continue' "
            "(docs/mixtures.md, 'Changing a mixture mid-run')"
        )

    # -- the saved state's slot, and a change at a resume

    def state_at(self, pass_index: int, offset: int, kept_from: int | None = None) -> dict[str, Any]:
        """Each source's draws before the saved stream position, and the change this mixture continues
        from: O(sources), so that another mixture (``on_change="continue"``) can take the run over there.
        ``kept_from``: also the weights in force over positions [kept_from, offset) of the pass (``kept``, a
        piece per segment), which a continuation keeps as they are; and a continued mixture's own ``held``
        pieces, part of its identity: O(sources) per piece."""
        stream = pass_index * self.num_samples + offset
        slot: dict[str, Any] = {
            "version": SLOT_VERSION,
            "num_samples": self.num_samples,
            "change": self.change,
            "draws": self._draws_at(stream).tolist(),
            "sizes": _size_checks(self.sizes),
            "sizes_digest": _sizes_digest(self.sizes),
        }
        kept = [] if kept_from is None else self._pieces(pass_index * self.num_samples + kept_from, stream)
        if kept or self._held:
            slot.update(version=2, held=_saved_pieces(self._held), kept=_saved_pieces(kept))
        return slot

    def _pieces(self, first: int, stop: int) -> list[Piece]:
        """The segments in force over stream positions [first, stop), cut to it: what those positions draw,
        without this mixture (a continued one's positions before its pieces are its own mixture's)."""
        pieces: list[Piece] = []
        if first >= stop:
            return pieces
        for segment in range(self._segment(first), self._segment(stop - 1) + 1):
            start = max(first, self._starts[segment])
            if self.change is not None and segment == 0:
                pieces += self._own._pieces(start, min(stop, self._starts[1]))
                continue
            counts, origin = self._periods[segment].counts, self._origins[segment]
            pieces.append(Piece(start, origin, counts, self._draws_before[segment]))
        return pieces

    def resume_from(self, saved: SavedOrder) -> Mixture | None:
        """The saved mixture when the state is one of this mixture's own (continued where the state says it
        changed); with ``on_change="continue"``, else, this mixture continued at the saved position from the
        saved draws. None (refused by the sampler, naming the fingerprint or the size): ``on_change="refuse"``
        and the state is another mixture's, or the state holds no draws (saved before 0.3.0)."""
        if saved.state is None:
            return None
        slot = self._checked_slot(saved.state)
        own = self._own
        if saved.fingerprint == self.fingerprint() and saved.size == sum(own.sizes.tolist()):
            return self  # its own state (a loader settling its pass): nothing to rebuild
        stream = saved.pass_index * self.num_samples + saved.offset
        if len(slot["draws"]) == len(own.sizes) and saved.size == sum(own.sizes.tolist()):
            draws = np.array(slot["draws"], dtype=np.int64)
            held = own._own_pieces(slot.get("held", []), len(draws))
            same = own if slot["change"] is None else own._rebuilt(slot["change"], stream, draws, held)
            if same is not None and same.fingerprint() == saved.fingerprint:
                return same
        if self.on_change == "refuse":
            return None
        own._check_saved_sources(slot, saved.size)
        draws = np.zeros(len(own.sizes), dtype=np.int64)
        draws[: len(slot["draws"])] = slot["draws"]  # appended sources start on their first pass
        return own.continued_at(stream, draws, own._own_pieces(slot.get("kept", []), len(slot["draws"]), stream))

    def _own_pieces(self, saved: list[Any], sources: int, stop: int | None = None) -> list[Piece]:
        """Saved pieces (checked by ``_checked_slot``) over this mixture's sources: appended ones draw nothing in
        them. ``stop``: the position they must end before (the continuation's start)."""
        pieces = []
        for start, origin, counts, draws in saved:
            grown = [np.zeros(len(self.sizes), dtype=np.int64) for _ in range(2)]
            grown[0][:sources], grown[1][:sources] = counts, draws
            pieces.append(Piece(start, origin, grown[0], grown[1]))
        if stop is not None and pieces and pieces[-1].start >= stop:
            raise IncompatibleStateError("strategy_state.kept", pieces[-1].start, f"pieces starting before {stop}")
        return pieces

    def continued_at(self, stream: int, draws: Any, held: list[Piece] | None = None) -> Mixture:
        """This mixture continuing a run at stream position ``stream`` whose sources had drawn ``draws``
        there: the segment in force at ``stream`` restarts its interleave there, and later schedule entries
        follow; O(sources) plus the counts of the later segments. ``held``: the saved run's pieces (its
        ``state_at(..., kept_from=)``) before ``stream``, whose positions draw as they did in the saved run."""
        draws = np.asarray(draws, dtype=np.int64)
        if draws.shape != self.sizes.shape or (draws < 0).any():
            raise ValueError(f"draws must hold one non-negative count per source ({len(self.sizes)}), got {draws}")
        own = self._own
        held = list(held or [])
        first = own._segment(stream)
        continued = copy.copy(own)
        continued.__dict__.pop("_fingerprint", None)
        continued.change = stream
        continued._held = held
        continued._starts = [0, *(piece.start for piece in held), stream, *own._starts[first + 1 :]]
        continued._origins = [0, *(piece.origin for piece in held), stream, *own._starts[first + 1 :]]
        continued._periods = [own._periods[0], *(quota_period(piece.counts) for piece in held), *own._periods[first:]]
        carried = [np.zeros_like(draws), *(piece.draws for piece in held), draws]
        for index in range(len(held) + 2, len(continued._starts)):
            length = continued._starts[index] - continued._starts[index - 1]
            carried.append(carried[-1] + continued._periods[index - 1].counts_before(length))
        continued._draws_before = carried
        return continued

    def _rebuilt(self, change: int, stream: int, draws: np.ndarray, held: list[Piece]) -> Mixture | None:
        """This mixture continued at ``change`` (keeping ``held``), with the draws there that give ``draws`` at
        ``stream``: the saved mixture, when this one is the mixture it continued with (else the fingerprints
        differ)."""
        probe = self.continued_at(change, np.zeros_like(draws), held) if 0 <= change < _MAX_STREAM else None
        if probe is None or (held and held[-1].start >= change):
            return None
        if held:  # the draws at the change are the held pieces' (a state saved inside them says less)
            last = len(held)
            at_change = probe._draws_before[last] + probe._periods[last].counts_before(change - probe._origins[last])
            return self.continued_at(change, at_change, held)
        if change > stream:
            return None
        at_change = draws - probe._draws_at(stream)
        if (at_change < 0).any():
            return None
        return self.continued_at(change, at_change, held)

    def _checked_slot(self, slot: Mapping[str, Any]) -> dict[str, Any]:
        """The saved slot, refused naming the field unless it is exactly a version 1 mixture slot."""
        version = slot.get("version") if isinstance(slot, Mapping) else None
        fields = _SLOT_FIELDS.get(version if type(version) is int else 0, _SLOT_FIELDS[SLOT_VERSION])
        if not isinstance(slot, Mapping) or set(slot) != set(fields):
            keys = sorted(slot) if isinstance(slot, Mapping) else slot
            raise IncompatibleStateError("strategy_state", keys, list(fields), "not a mixture's state")
        if type(version) is not int or version not in _SLOT_FIELDS:
            raise IncompatibleStateError("strategy_state.version", version, list(_SLOT_FIELDS), "unknown version")
        change = slot["change"]
        if change is not None and (type(change) is not int or not 0 <= change < _MAX_STREAM):
            raise IncompatibleStateError("strategy_state.change", change, "None or a stream position in [0, 2**62)")
        draws = slot["draws"]
        if not isinstance(draws, (list, tuple)) or not draws or not all(_is_count(v) for v in draws):
            raise IncompatibleStateError("strategy_state.draws", draws, "a list of non-negative ints, one per source")
        sizes = slot["sizes"]
        if not isinstance(sizes, str) or len(sizes) != len(draws) or not set(sizes) <= set(_CHECK_CHARS):
            raise IncompatibleStateError(
                "strategy_state.sizes", sizes, f"one check character per source ({len(draws)})"
            )
        if not isinstance(slot["sizes_digest"], str):
            raise IncompatibleStateError("strategy_state.sizes_digest", slot["sizes_digest"], "a str")
        for name in ("held", "kept") if version == 2 else ():
            _check_pieces(f"strategy_state.{name}", slot[name], len(draws))
        return dict(slot)

    def _check_saved_sources(self, slot: Mapping[str, Any], saved_size: int) -> None:
        """Refuse a mixture that does not keep the saved sources first, in order, with their sizes, naming the
        first source that differs (a removed source keeps its place, with weight 0)."""
        if slot["num_samples"] != self.num_samples:
            raise IncompatibleStateError(
                "num_samples", slot["num_samples"], self.num_samples,
                "a mixture's epoch length places its epochs in the stream: keep it to continue the saved run",
            )  # fmt: skip
        saved = len(slot["draws"])
        if saved > len(self.sizes):
            raise IncompatibleStateError(
                "sizes", f"{saved} sources", f"{len(self.sizes)} sources",
                "a mixture continues a saved run with its sources first, in order: keep a removed source, with "
                "weight 0, and append new ones after the saved ones",
            )  # fmt: skip
        mine = _size_checks(self.sizes[:saved])
        for d, (before, now) in enumerate(zip(slot["sizes"], mine)):
            if before != now:
                raise IncompatibleStateError(
                    f"sizes[{d}]", "the saved source's size", int(self.sizes[d]),
                    f"source {d} has another size than in the saved run, or the sources were reordered: keep the "
                    f"saved sources first, in order, with their sizes",
                )  # fmt: skip
        if sum(self.sizes[:saved].tolist()) != saved_size or _sizes_digest(self.sizes[:saved]) != slot["sizes_digest"]:
            raise IncompatibleStateError(
                "sizes", f"{saved} sources of {saved_size} records", self.sizes[:saved].tolist(),
                "the saved sources' sizes differ from these (a source resized or reordered): keep the saved "
                "sources first, in order, with their sizes",
            )  # fmt: skip

    def _identity(self) -> tuple[Any, ...]:
        own = self._own
        segments = ((key, period.counts) for key, period in zip(own._keys, own._periods))
        identity = (own.sizes, own.num_samples, *segments)
        if self.change is None:
            return identity
        held = [(piece.start, piece.origin, piece.counts, piece.draws) for piece in self._held]
        return (*identity, "continued", self.change, self._draws_before[len(self._held) + 1], *held)


class Piece(NamedTuple):
    """Stream positions from ``start`` (to the next piece's start) drawn at ``counts`` by an interleave begun at
    ``origin``, whose sources had drawn ``draws`` there: a segment of a saved run, as a continuation keeps it."""

    start: int
    origin: int
    counts: np.ndarray
    draws: np.ndarray


def _saved_pieces(pieces: list[Piece]) -> list[list[Any]]:
    return [[piece.start, piece.origin, piece.counts.tolist(), piece.draws.tolist()] for piece in pieces]


def _check_pieces(name: str, pieces: Any, sources: int) -> None:
    """Refuse saved pieces, naming the field, unless each is [start, origin, counts, draws] with ascending starts,
    an origin at or before its start, and one count (not all 0) and one draw count per saved source."""
    if not isinstance(pieces, (list, tuple)):
        raise IncompatibleStateError(name, pieces, "a list of [start, origin, counts, draws] pieces")
    last = -1
    for at, piece in enumerate(pieces):
        where = f"{name}[{at}]"
        if not isinstance(piece, (list, tuple)) or len(piece) != 4:
            raise IncompatibleStateError(where, piece, "[start, origin, counts, draws]")
        start, origin, counts, draws = piece
        if not (_is_count(start) and _is_count(origin) and last < start and origin <= start):
            raise IncompatibleStateError(where, [start, origin], f"ascending starts after {last}, each origin <= start")
        for field, values in (("counts", counts), ("draws", draws)):
            if not isinstance(values, (list, tuple)) or len(values) != sources or not all(map(_is_count, values)):
                raise IncompatibleStateError(f"{where}.{field}", values, f"{sources} non-negative ints, one per source")
        if not any(counts):
            raise IncompatibleStateError(f"{where}.counts", counts, "a positive weight")
        last = start


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < _MAX_STREAM


def _size_checks(sizes: np.ndarray) -> str:
    """One character per source, 6 bits of a hash of (source, size): a resized source is named (the digest
    catches the rest)."""
    return "".join(
        _CHECK_CHARS[hashlib.blake2b(f"{d}:{size}".encode(), digest_size=1).digest()[0] & 63]
        for d, size in enumerate(sizes.tolist())
    )


def _sizes_digest(sizes: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(sizes, dtype=np.int64).tobytes(), digest_size=6).hexdigest()


class _MixturePass:
    """One epoch's records; its set-up is nothing but the epoch's place in the stream."""

    def __init__(self, mixture: Mixture, seed: int, pass_index: int) -> None:
        self._mixture = mixture
        self._pass_index = pass_index
        self._seed_prefix = derive_seed(Domain.PERMUTATION, seed, _TAG)  # source-epoch e's seed: this, extended by e

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Records at positions of the epoch: source and draw from the interleave, then the draw's
        record in that source's own permutation of its source-epoch (seeded by (seed, source-epoch): one
        cipher for the block, however many source-epochs its small sources span)."""
        mixture = self._mixture
        sources, draws = mixture.locate(self._pass_index, positions)
        source_epochs, inside = np.divmod(draws, mixture.sizes[sources])
        seeds = mix64_array(source_epochs.view(np.uint64), self._seed_prefix, np.empty(len(draws), np.uint64))
        return mixture.offsets[sources] + mixture._permutations.at_seeds(seeds, sources, inside)
