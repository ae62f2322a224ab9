"""Compare an uninterrupted run at world size A with one killed there and resumed at world size B.

At another world size the batches are not the uninterrupted run's (each step takes B·batch records,
not A·batch), so the rules are the elastic contract's: per epoch the same multiset of records,
nothing consumed twice or lost, and every rank the same number of steps. Exact batches are checked
where the layout is kept: the killed run at A against the uninterrupted run, and the runs at B
against each other where a later one retrains the steps an earlier one lost with its kill. One more
rule is tested and reported, not required: the global order (each step's records taken position by
position, rank by rank) is the uninterrupted run's, which the sampler's layout (rank r takes
positions r, r+W, ...) keeps at any world size.

A record is named by its dataset index when the batches carry a collated ``SampleKey``
(``StatefulSampler(yield_keys=True)`` over a ``KeyedDataset``), else by the fingerprint of its row
of the batch's tensors.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from stateful_sampler.verify.compare import NOT_RESUMED, describe_mismatch, where
from stateful_sampler.verify.errors import TrainingRunError
from stateful_sampler.verify.recorder import BatchRecord, RunRecord

NO_KEYS = (
    "--resize compares the records of each epoch, and the batches name none (no SampleKey, and no tensors "
    "sharing a first dimension): let the sampler yield keys, StatefulSampler(dataset, yield_keys=True) over "
    "KeyedDataset(dataset), so each batch carries a SampleKey"
)
_NAMED = 8  # records named in a message, at most

Record = int | str  # a dataset index, or the fingerprint of a record of a batch that carries none
Place = tuple[int, int]  # (epoch, records of the epoch consumed before it): the same at any world size
_LAST = 1 << 30  # sorts a problem after the records' problems of its step


@dataclass(frozen=True)
class ResizeReport:
    """The verdict of a resize, with the evidence: which rules held, and the first problem if any."""

    sizes: tuple[int, int]  # world size of the uninterrupted and killed run, of the resumed runs
    kill_steps: tuple[int, ...]  # steps of the uninterrupted run after which each run was killed
    resumed_froms: tuple[str, ...]  # where each resumed run started, described
    exact_compared: int  # batches the killed run trained on at world size A
    exact_identical: int  # of them, those identical to the uninterrupted run's
    retrained: int  # batches at world size B that a later run trained again, all identical when equal
    records: int  # records of the uninterrupted run, over every epoch
    epochs: int
    steps_per_rank: tuple[tuple[int, int], ...]  # (epoch, steps of each rank) of the runs at world size B
    global_order: bool  # every epoch's records in the uninterrupted run's global order
    first_divergence: str | None
    resume_problem: str | None  # the first resumed run that did not start at the last checkpoint
    killed_agent: tuple[int, int] | None = None  # (--agents) the agent killed with its workers, of how many
    kill_seed: int | None = None  # the seed the kill step was drawn with; None: given (--kill-at)

    @property
    def equal(self) -> bool:
        return self.first_divergence is None

    @property
    def rule(self) -> str:
        """The strongest rule that held."""
        return "global order" if self.equal and self.global_order else "multiset"


def records_of(record: BatchRecord) -> list[Record]:
    """The records of a batch: its dataset indices, else each record's fingerprint."""
    return list(record.indices if record.indices is not None else record.rows or [])


def batch_size_of(reference: RunRecord) -> int:
    """Records a rank takes per step: the largest batch of the uninterrupted run."""
    sizes = [len(records_of(record)) for record in reference.batches if records_of(record)]
    if not reference.batches or len(sizes) < len(reference.batches):
        raise TrainingRunError(NO_KEYS)
    return max(sizes)


def compare_resized(
    reference: RunRecord,
    runs: list[RunRecord],
    sizes: tuple[int, int],
    kill_steps: list[int],
    *,
    not_resumed: str = NOT_RESUMED,
) -> ResizeReport:
    """``runs``: the killed run at world size A, then each resumed run at B (the last one to the end).
    A run's batches at and after the last checkpoint it wrote are superseded (the final weights never
    trained on them); the rest, in order, must meet the elastic rules.

    Example:
        >>> from stateful_sampler.verify.recorder import BatchRecord, RunRecord
        >>> def batch(rank, place, records, step):  # one record a rank per step
        ...     return BatchRecord(rank, 0, place, step, f"f{records}", records)
        >>> at_two = [batch(0, 0, [0], 0), batch(0, 1, [2], 1), batch(1, 0, [1], 0), batch(1, 1, [3], 1)]
        >>> reference = killed = RunRecord(at_two, [1], None)  # killed after step 1, its checkpoint
        >>> resumed = RunRecord([batch(0, 2, [2], 0), batch(0, 3, [3], 1)], [], None)  # 1 rank, from record 2
        >>> compare_resized(reference, [killed, resumed], (2, 1), [1]).rule
        'global order'
    """
    batch = batch_size_of(reference)
    worlds = [sizes[0]] + [sizes[1]] * (len(runs) - 1)
    epoch_records = Counter(record.epoch for record in reference.batches for _ in records_of(record))
    layout = _Layout(batch, epoch_records)
    problems: list[tuple[tuple[int, int], str]] = []
    expected = {record.key: record for record in reference.batches}
    killed = runs[0]
    identical = 0
    for record in killed.batches:
        want = expected.get(record.key)
        if want is None:
            problems.append(
                (
                    (record.step, record.rank),
                    f"{where(record)}: the killed run has a batch the uninterrupted run never had",
                )
            )
        elif (want.fingerprint, want.indices) != (record.fingerprint, record.indices):
            problems.append(((record.step, record.rank), describe_mismatch("killed", want, record)))
        else:
            identical += 1
    starts = [layout.start(run, world) for run, world in zip(runs, worlds)]
    # What each run leaves to the final weights: its steps before the last checkpoint it wrote (none
    # if it wrote none: its successor loads the checkpoint it loaded itself); the last run, all.
    saves = [layout.last_checkpoint(run, world) or start for run, world, start in zip(runs, worlds, starts)]
    kept: list[list[BatchRecord]] = []
    bases, base = [], 0
    for index, run in enumerate(runs):
        until = saves[index] if index + 1 < len(runs) else None
        keep = [record for record in run.batches if until is None or layout.place(record, worlds[index]) < until]
        kept.append(keep)
        bases.append(base)
        base += sum(1 for record in keep if record.rank == 0)
    chain = [_chained(keep, start, world) for keep, start, world in zip(kept, bases, worlds)]
    resumed_froms = []
    resume_problem = None
    saved: Place | None = None
    for index in range(1, len(runs)):
        saved = layout.last_checkpoint(runs[index - 1], worlds[index - 1]) or saved
        resumed_froms.append(layout.describe(starts[index], bases[index], worlds[index]))
        problem = _start_problem(saved, starts[index], bases[index], worlds, index, kill_steps, not_resumed)
        if problem is not None:
            problems.append(((bases[index], _LAST), problem))
            resume_problem = resume_problem or problem
    retrained = _retrained(runs[1:], problems, chain[1:])
    steps_per_rank = _equal_steps(kept, chain, worlds, problems)
    global_order = _data_rules(reference, chain, layout, problems)
    return ResizeReport(
        sizes=sizes,
        kill_steps=tuple(kill_steps),
        resumed_froms=tuple(resumed_froms),
        exact_compared=len(killed.batches),
        exact_identical=identical,
        retrained=retrained,
        records=sum(epoch_records.values()),
        epochs=len(epoch_records),
        steps_per_rank=steps_per_rank,
        global_order=global_order,
        first_divergence=min(problems)[1] if problems else None,
        resume_problem=resume_problem,
    )


@dataclass(frozen=True)
class _Layout:
    """Places in an epoch, in records consumed before a batch: the measure shared by every world size."""

    batch: int
    epoch_records: Counter[int]

    def place(self, record: BatchRecord, world: int) -> Place:
        return (record.epoch, record.batch_idx * world * self.batch)

    def start(self, run: RunRecord, world: int) -> Place | None:
        return self.place(run.batches[0], world) if run.batches else None

    def last_checkpoint(self, run: RunRecord, world: int) -> Place | None:
        """The place of the run's last checkpoint: its steps count from the run's first batch."""
        first = [record for record in run.batches if record.rank == 0]
        if not first or not run.checkpoint_steps:
            return None
        done = max(run.checkpoint_steps) - first[0].step
        if done < len(first):
            return self.place(first[done], world)
        epoch, position = self.place(first[-1], world)
        position += world * self.batch
        return (epoch + 1, 0) if position >= self.epoch_records[epoch] else (epoch, position)

    def describe(self, place: Place | None, step: int, world: int) -> str:
        if place is None:
            return "nowhere (no batch)"
        epoch, position = place
        return f"step {step} (epoch {epoch}, record {position} of {self.epoch_records[epoch]}, world size {world})"


@dataclass(frozen=True)
class _Chained:
    step: int  # steps the resumed training had done before this batch, kills and resumes included
    record: BatchRecord
    world: int


def _chained(records: list[BatchRecord], base: int, world: int) -> list[_Chained]:
    done: Counter[int] = Counter()
    chained = []
    for record in records:
        chained.append(_Chained(base + done[record.rank], record, world))
        done[record.rank] += 1
    return chained


def _start_problem(
    saved: Place | None,
    start: Place | None,
    step: int,
    worlds: list[int],
    index: int,
    kill_steps: list[int],
    not_resumed: str,
) -> str | None:
    where = (
        f"step {step}, where the run killed after step {kill_steps[index - 1]} resumes at world size {worlds[index]}"
    )
    if saved is None:
        return f"{where}: no run wrote a checkpoint before: kill later or checkpoint more often"
    if start is None:
        return f"{where}: the resumed run trained on no batch"
    if start == saved:
        return None
    return (
        f"{where}: the resumed run started at epoch {start[0]}, record {start[1]}, not at the last checkpoint "
        f"(epoch {saved[0]}, record {saved[1]}): {not_resumed}"
    )


def _retrained(runs: list[RunRecord], problems: list[tuple[tuple[int, int], str]], chain: list[list[_Chained]]) -> int:
    """Batches at world size B that a later run trained on again, from a checkpoint before a kill:
    the same layout, so they must be identical."""
    first: dict[tuple[int, int, int], BatchRecord] = {}
    count = 0
    for run, chained in zip(runs, chain):
        steps = {id(each.record): each.step for each in chained}
        for record in run.batches:
            earlier = first.setdefault(record.key, record)
            if earlier is record:
                continue
            count += 1
            if (earlier.fingerprint, earlier.indices) != (record.fingerprint, record.indices):
                step = steps.get(id(record), record.step)
                message = describe_mismatch("resumed", earlier, record)
                problems.append(((step, record.rank), message.replace("the uninterrupted run", "the run before it")))
    return count


def _equal_steps(
    kept: list[list[BatchRecord]],
    chain: list[list[_Chained]],
    worlds: list[int],
    problems: list[tuple[tuple[int, int], str]],
) -> tuple[tuple[int, int], ...]:
    """Every rank of a run trains the same number of steps in each epoch (a rank with fewer would
    wait forever in DDP's all-reduce); the runs at world size B, summed per epoch, for the report."""
    totals: Counter[int] = Counter()
    for number, (records, chained, world) in enumerate(zip(kept, chain, worlds)):
        per_epoch: dict[int, Counter[int]] = {}
        for record in records:
            per_epoch.setdefault(record.epoch, Counter())[record.rank] += 1
        for epoch, ranks in sorted(per_epoch.items()):
            counts = [ranks[rank] for rank in range(world)]
            if len(set(counts)) > 1 or set(ranks) - set(range(world)):
                first = next(each for each in chained if each.record.epoch == epoch)
                steps = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(ranks.items()))
                problems.append(
                    (
                        (first.step, -1),
                        (f"epoch {epoch} at world size {world}: the ranks trained unequal steps ({steps})"),
                    )
                )
            if number > 0:
                totals[epoch] += counts[0]
    return tuple(sorted(totals.items()))


def _data_rules(
    reference: RunRecord,
    chain: list[list[_Chained]],
    layout: _Layout,
    problems: list[tuple[tuple[int, int], str]],
) -> bool:
    """Per epoch, the records trained on (killed run's kept steps, then the resumed runs') against the
    uninterrupted run's: each once, none lost, none foreign; returns whether the global order held."""
    ordered = sorted((each for chained in chain for each in chained), key=lambda each: (each.step, each.record.rank))
    want = {epoch: Counter[Record]() for epoch in layout.epoch_records}
    for record in reference.batches:
        want[record.epoch].update(records_of(record))
    seen = {epoch: Counter[Record]() for epoch in want}
    first_seen: dict[tuple[int, Record], int] = {}
    last_step: dict[int, int] = {}
    for each in ordered:
        record = each.record
        epoch_want, epoch_seen = want.get(record.epoch, Counter()), seen.setdefault(record.epoch, Counter())
        indices = records_of(record)
        foreign = [index for index in indices if epoch_want[index] == 0]
        twice = [index for index in indices if 0 < epoch_want[index] <= epoch_seen[index]]
        for index in indices:
            epoch_seen[index] += 1
            first_seen.setdefault((record.epoch, index), each.step)
        last_step[record.epoch] = each.step
        at = f"step {each.step} (epoch {record.epoch}, batch {record.batch_idx} at world size {each.world}), rank {record.rank}"
        if twice:
            before = sorted({first_seen[(record.epoch, index)] for index in twice})
            problems.append(
                (
                    (each.step, record.rank),
                    (
                        f"{at}: records {_names(twice)} trained on a second time in "
                        f"epoch {record.epoch} (first at step {', '.join(map(str, before))})"
                    ),
                )
            )
        if foreign:
            problems.append(
                (
                    (each.step, record.rank),
                    (f"{at}: records {_names(foreign)} are not in the uninterrupted run's epoch {record.epoch}"),
                )
            )
    for epoch, epoch_want in sorted(want.items()):
        lost = sorted((epoch_want - seen[epoch]).elements())
        if lost:
            step = last_step.get(epoch, -1) + 1
            problems.append(
                (
                    (step, -2),
                    (
                        f"epoch {epoch}: records {_names(lost)} ({len(lost)} of "
                        f"{layout.epoch_records[epoch]}) never trained on"
                    ),
                )
            )
    return all(
        _global_order([(each.step, each.record) for each in ordered if each.record.epoch == epoch])
        == _global_order([(record.batch_idx, record) for record in reference.batches if record.epoch == epoch])
        for epoch in want
    )


def _global_order(steps: list[tuple[int, BatchRecord]]) -> list[Record]:
    """One epoch's records as one sequence: step by step, each step position by position, rank by
    rank (rank r's j-th record of a step sits at the step's global position j·W + r)."""
    by_step: dict[int, dict[int, list[Record]]] = {}
    for step, record in steps:
        by_step.setdefault(step, {})[record.rank] = records_of(record)
    sequence: list[Record] = []
    for _, ranks in sorted(by_step.items()):
        for position in range(max(len(indices) for indices in ranks.values())):
            sequence.extend(ranks[rank][position] for rank in sorted(ranks) if position < len(ranks[rank]))
    return sequence


def _names(values: list[Record]) -> str:
    shown = ", ".join(map(str, values[:_NAMED]))
    return f"[{shown}, ... {len(values)} in all]" if len(values) > _NAMED else f"[{shown}]"
