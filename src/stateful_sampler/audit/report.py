"""The audit's answer: typed, immutable, and JSON-ready through ``to_dict``.

Counts are kept apart on purpose: an *occurrence* is one sample fed to the model (a record may
occur twice in an epoch, as padding or as carried remainder), a *record* is one item of the
dataset. Rates that mix the two are how "one epoch covered the dataset" goes wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class AuditSettings:
    """What was audited: the order's identity, the ranks and the loader around the sampler."""

    size: int
    world_size: int
    seed: int
    shuffle: bool
    tail: str
    order: str
    sampler_batch_size: int | None  # the sampler's own batch size (sets carry's epoch boundaries)
    batch_size: int  # the loader's per-rank batch
    drop_last: bool  # the loader's batch-level drop_last (the tail policy is the rank level)
    num_workers: int  # reported only: workers load batches the main process formed, so they change no count
    start_epoch: int
    epochs: int
    strategy: str = "uniform"  # the sampler's strategy (its name)


@dataclass(frozen=True)
class Occurrence:
    """One sample slot of a rank: which record, and whether it only pads the ranks to equal length."""

    rank: int
    record: int
    is_padding: bool


@dataclass(frozen=True)
class Duplicate:
    """A record fed more than once in one epoch."""

    record: int
    occurrences: int
    padding: int  # how many of those occurrences were padding repeats


@dataclass(frozen=True)
class RankBatches:
    """One rank's epoch as its DataLoader cuts it into batches."""

    rank: int
    samples: int  # indices the sampler gives this rank
    batches: int  # batches the loader yields, i.e. optimizer steps
    last_batch_size: int  # size of the last batch yielded (0 when none is)


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    occurrences: int  # samples fed to the model, over all ranks, padding included
    distinct: int  # records fed at least once
    padding: int  # fed occurrences that only repeat a record to even out the ranks
    duplicates: tuple[Duplicate, ...]
    dropped_by_tail: tuple[int, ...]  # rank level: records the tail policy leaves out of the epoch
    dropped_by_batch: tuple[Occurrence, ...]  # batch level: samples cut by the loader's drop_last
    ranks: tuple[RankBatches, ...]
    equal_steps: bool  # every rank takes the same number of steps (unequal counts hang DDP)
    short_batches: tuple[int, ...]  # ranks whose last batch is smaller than batch_size
    single_sample_batches: tuple[int, ...]  # ranks whose last batch holds one sample (BatchNorm hazard)
    carried_in: tuple[int, ...]  # carry: records of the previous pass that open this epoch
    carried_over: tuple[int, ...]  # carry: records of this pass rolled over into the next epoch
    unseen: int  # records not fed in this epoch


@dataclass(frozen=True)
class EpochComposition:
    """What the batches of one epoch are made of, per class (or group, or band), against the target."""

    epoch: int
    classes: tuple[int, ...]
    target: tuple[float, ...]  # share per class
    fed: tuple[int, ...]  # occurrences per class over the epoch
    steps: int  # global steps: batch j of every rank
    max_step_deviation: float  # largest |share in a step's batch - target| over steps and classes
    worst_step: int  # the step where it occurs (-1 without steps)
    first_steps: int  # the first batches pooled (the seed material's check)
    first_steps_deviation: float  # largest |share in them - target| over classes
    chi_square: float  # the epoch's class counts against the target (Pearson)
    degrees_of_freedom: int
    p_value: float


@dataclass(frozen=True)
class HistogramBin:
    low: int
    high: int  # inclusive
    records: int


@dataclass(frozen=True)
class BatchMates:
    """For each record, how many distinct other records shared a (per-rank) batch with it."""

    records_measured: int
    exact: bool  # every record was measured; otherwise a uniform sample of records_measured
    minimum: int
    maximum: int
    mean: float
    reaching_all: int  # measured records that met all N-1 others
    lowest: tuple[tuple[int, int], ...]  # (record, mates) of the least mixed records
    histogram: tuple[HistogramBin, ...]


@dataclass(frozen=True)
class RecordCounts:
    """Per record and epoch (rows: epochs): what the picture draws. Not part of ``to_dict``."""

    occurrences: np.ndarray  # how often each record was fed
    padded: np.ndarray  # the record was fed (or cut) as a padding repeat
    dropped: np.ndarray  # the tail policy or drop_last cut an occurrence of the record
    mates: np.ndarray | None  # batch mates per record over all epochs (-1: not measured)
    composition: tuple[np.ndarray, ...] = ()  # with labels: per epoch, occurrences per (step, class)


@dataclass(frozen=True)
class AuditReport:
    settings: AuditSettings
    epochs: tuple[EpochReport, ...]
    cumulative_distinct: tuple[int, ...]  # distinct records fed from the first audited epoch to each one
    never_seen: tuple[int, ...]  # records fed in no audited epoch
    occurrences_min: int  # per record, over all audited epochs
    occurrences_max: int
    occurrence_histogram: dict[int, int]  # occurrences over all epochs -> records with that count
    occurrences_per_pass: float  # samples fed per epoch: what an examples-per-second figure counts
    distinct_per_pass: float  # distinct records fed per epoch: what the model actually learns from
    batch_mates: BatchMates | None  # None when not even a sample fits the limits (see ``limits``)
    warnings: tuple[str, ...]
    limits: tuple[str, ...]  # where the audit sampled instead of counting everything
    counts: RecordCounts = field(repr=False, compare=False)
    composition: tuple[EpochComposition, ...] = ()  # with labels: what each epoch's batches are made of

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-record arrays, as JSON-ready builtins."""
        data = {name: value for name, value in asdict(self).items() if name != "counts"}
        data["occurrence_histogram"] = {str(k): v for k, v in self.occurrence_histogram.items()}
        return data
