"""Whether two certificates trained on the same data: step by step, or (where a run changed its world
size or batch size in an epoch) the same multiset of records in that epoch, nothing twice or lost.

An epoch both runs laid out alike must match step by step; the multiset rule applies only to an epoch
whose steps a resize changed. The verdict's exit codes are verify's: 0 equal (either rule, said which),
1 different, 2 could not compare.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from stateful_sampler.certificate.format import PADDING_BIT
from stateful_sampler.certificate.run import GlobalStep, Run

EQUAL, DIFFERENT, CANNOT_COMPARE = 0, 1, 2
_ORDER_FIELDS = ("size", "shuffle", "tail", "order", "strategy", "strategy_fingerprint")  # the dataset and order
_SHOWN = 16  # records shown of a step or an epoch's difference


@dataclass
class Comparison:
    """The verdict: ``code`` (0 equal, 1 different, 2 could not compare) and the lines that explain it."""

    code: int
    rule: str  # "step by step", "multiset per epoch", "" when not equal
    lines: list[str] = field(default_factory=list)
    first_difference: int | None = None  # step index in the first run

    def report(self) -> str:
        return "\n".join(self.lines)


def compare(first: Run, second: Run) -> Comparison:
    """Compare two certificates read with ``read_run``: equal step by step, else per epoch (see module doc).

    Example:
        >>> import numpy as np
        >>> def run(*steps):
        ...     keys = [GlobalStep(k, 0, 1, 2, 2 * k, 2 * k + 2, np.array(s, np.uint64)) for k, s in enumerate(steps)]
        ...     return Run(Path("x"), keys, [])
        >>> from pathlib import Path
        >>> compare(run([1, 2], [3, 4]), run([1, 2], [3, 4])).code
        0
        >>> print(compare(run([1, 2], [3, 4]), run([1, 2], [4, 3])).report())
        DIFFERENT: first at step 1 (epoch 0)
          x: step 1, epoch 0, positions [2, 4), world size 1: records [3, 4]
          x: step 1, epoch 0, positions [2, 4), world size 1: records [4, 3]
          epoch 0: the same records in another order; both runs laid it out as 1 x 2 (ranks x batch): it must match step by step
    """
    lines = [_summary(run) for run in (first, second) if run.starts]  # a run built in memory has no starts
    for name in _ORDER_FIELDS:
        mine, theirs = first.identity.get(name), second.identity.get(name)
        if mine != theirs:
            return Comparison(
                CANNOT_COMPARE,
                "",
                [*lines, f"COULD NOT COMPARE: another dataset or order ({name}: {mine!r} vs {theirs!r})"],
            )
    if first.identity.get("seed") != second.identity.get("seed"):
        lines.append(f"note: the seeds differ ({first.identity.get('seed')} vs {second.identity.get('seed')})")
    mismatch = _first_mismatch(first.steps, second.steps)
    if mismatch is None:
        return Comparison(
            EQUAL, "step by step", [*lines, f"EQUAL: the same data step by step ({len(first.steps)} steps)"]
        )
    epochs_a, epochs_b = _by_epoch(first.steps), _by_epoch(second.steps)
    if list(epochs_a) != list(epochs_b):
        return _different(
            first, second, mismatch, lines, f"the runs' epochs differ: {list(epochs_a)} vs {list(epochs_b)}"
        )
    elastic = []
    for epoch in epochs_a:
        mine, theirs = epochs_a[epoch], epochs_b[epoch]
        index = _first_mismatch(mine, theirs)
        if index is None:
            continue
        only_a, only_b = _multiset_difference(mine, theirs)
        resized = _layouts(mine) != _layouts(theirs) or len(_layouts(mine)) > 1
        if only_a or only_b or not resized:
            if only_a or only_b:
                detail = (f"epoch {epoch}: {sum(only_a.values())} records only in {first.prefix.name} "
                          f"{_shown(only_a)}, {sum(only_b.values())} only in {second.prefix.name} {_shown(only_b)}")  # fmt: skip
            else:
                detail = f"epoch {epoch}: the same records in another order"
            if not resized:
                detail += f"; both runs laid it out as {_describe(mine)} (ranks x batch): it must match step by step"
            return _different(first, second, _global_mismatch(mine, theirs, index), lines, detail)
        elastic.append(epoch)
    resizes = ", ".join(
        f"epoch {epoch}: {_describe(epochs_a[epoch])} vs {_describe(epochs_b[epoch])}" for epoch in elastic
    )
    return Comparison(
        EQUAL,
        "multiset per epoch",
        [*lines, (f"EQUAL (the same multiset per epoch): step by step the runs differ from step {mismatch[0]}, where "
         f"the layout changed ({resizes}); each of those epochs trained on the same records, none twice or lost, "
         f"and every other epoch matches step by step")],
    )  # fmt: skip


def _summary(run: Run) -> str:
    resumes = sum(1 for start in run.starts if start["restored"] and start["rank"] == 0)
    continued = sum(1 for start in run.starts if start.get("continued") and start["rank"] == 0)
    sizes: list[int] = []
    for start in run.starts:
        if start["rank"] == 0 and (not sizes or sizes[-1] != start["world_size"]):
            sizes.append(start["world_size"])
    epochs = len({step.epoch for step in run.steps})
    parts = [f"{run.prefix}: {len(run.steps)} steps in {epochs} epochs, seed {run.identity.get('seed')}",
             f"{resumes} resumes", f"world size {' -> '.join(map(str, sizes)) or '?'}", f"digest {run.digest()}"]  # fmt: skip
    if continued:
        parts.insert(2, f"{continued} restarts WITHOUT the loader state restored")
    return ", ".join(parts)


def _step_key(step: GlobalStep) -> tuple[int, bytes]:
    return step.epoch, step.keys.tobytes()


def _first_mismatch(mine: list[GlobalStep], theirs: list[GlobalStep]) -> tuple[int, int] | None:
    """Indices (into each list) of the first step that differs, or where one list ends first; None: equal."""
    for index, (a, b) in enumerate(zip(mine, theirs)):
        if _step_key(a) != _step_key(b):
            return index, index
    if len(mine) != len(theirs):
        shorter = min(len(mine), len(theirs))
        return shorter, shorter
    return None


def _global_mismatch(mine: list[GlobalStep], theirs: list[GlobalStep], index: tuple[int, int]) -> tuple[int, int]:
    """An epoch's mismatch as step numbers of each run (the step after the last, where a run ends first)."""
    return _step_number(mine, index[0]), _step_number(theirs, index[1])


def _step_number(steps: list[GlobalStep], index: int) -> int:
    return steps[index].step if index < len(steps) else steps[-1].step + 1


def _by_epoch(steps: list[GlobalStep]) -> dict[int, list[GlobalStep]]:
    epochs: dict[int, list[GlobalStep]] = {}
    for step in steps:
        epochs.setdefault(step.epoch, []).append(step)
    return epochs


def _layouts(steps: list[GlobalStep]) -> set[tuple[int, int]]:
    return {(step.world_size, step.batch_size) for step in steps}


def _describe(steps: list[GlobalStep]) -> str:
    layouts: list[tuple[int, int]] = []
    for step in steps:
        if not layouts or layouts[-1] != (step.world_size, step.batch_size):
            layouts.append((step.world_size, step.batch_size))
    return " -> ".join(f"{world} x {batch}" for world, batch in layouts)


def _multiset_difference(mine: list[GlobalStep], theirs: list[GlobalStep]) -> tuple[Counter[int], Counter[int]]:
    """Records (padding left out) one epoch trained on more often in one run than in the other."""
    counts = [_records(steps) for steps in (mine, theirs)]
    return counts[0] - counts[1], counts[1] - counts[0]


def _records(steps: list[GlobalStep]) -> Counter[int]:
    keys = np.concatenate([step.keys for step in steps]) if steps else np.empty(0, np.uint64)
    return Counter(keys[(keys & PADDING_BIT) == 0].tolist())


def _shown(counts: Counter[int]) -> str:
    records = sorted(counts.elements())
    return str(records[:_SHOWN])[:-1] + (", ...]" if len(records) > _SHOWN else "]")


def _different(first: Run, second: Run, steps: tuple[int, int], lines: list[str], detail: str) -> Comparison:
    mine, theirs = (_find(run.steps, step) for run, step in ((first, steps[0]), (second, steps[1])))
    epoch = mine.epoch if mine is not None else theirs.epoch if theirs is not None else "?"
    where = (
        f"step {steps[0]}"
        if steps[0] == steps[1]
        else f"step {steps[0]} of {first.prefix.name}, {steps[1]} of {second.prefix.name}"
    )
    out = [*lines, f"DIFFERENT: first at {where} (epoch {epoch})"]
    out += [
        _describe_step(run, step, number) for run, step, number in ((first, mine, steps[0]), (second, theirs, steps[1]))
    ]
    if detail:
        out.append(f"  {detail}")
    return Comparison(DIFFERENT, "", out, steps[0])


def _find(steps: list[GlobalStep], number: int) -> GlobalStep | None:
    return steps[number] if number < len(steps) else None


def _describe_step(run: Run, step: GlobalStep | None, number: int) -> str:
    if step is None:
        return f"  {run.prefix.name}: step {number}: none (the run ends after {len(run.steps)} steps)"
    records = step.records()
    shown = str(records[:_SHOWN])[:-1] + (", ...]" if len(records) > _SHOWN else "]")
    return (f"  {run.prefix.name}: step {step.step}, epoch {step.epoch}, positions [{step.before}, {step.after}), "
            f"world size {step.world_size}: records {shown}")  # fmt: skip
