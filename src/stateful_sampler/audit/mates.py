"""Batch-mate diversity: for each record, how many distinct other records shared a batch with it.

A healthy global shuffle reaches N-1 within a few epochs; a shuffle that only mixes fixed chunks
(burn's per-worker defect) keeps a low minimum however long it trains.

The exact count is the size of the union of a record's batches, so its cost is the number of
(record, batch mate) pairs, the sum over all batches of size squared, not N^2 memory. Records
are processed in chunks, each chunk's pairs sorted and deduplicated, so memory stays bounded.
Past ``PAIR_LIMIT`` pairs a uniform sample of records is measured instead, each of them exactly,
and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stateful_sampler.audit.report import BatchMates, HistogramBin

PAIR_LIMIT = 1 << 26  # a few seconds of sorting (10 s for N = 10**6 on 2 busy cores, measured)
_CHUNK_PAIRS = 1 << 22  # pairs sorted at once: bounds the memory, 32 MiB of keys
_SAMPLE_SEED = 0  # the sample is part of the report's identity: the same audit gives the same sample
_HISTOGRAM_BINS = 20
_LOWEST = 10


@dataclass(frozen=True)
class FedBatches:
    """One epoch's fed records, all ranks, batch after batch, with the batch each occurrence is in."""

    records: np.ndarray
    batch_sizes: np.ndarray

    @property
    def pairs(self) -> int:
        return int(np.sum(self.batch_sizes.astype(np.int64) ** 2))


def plan_sample(size: int, pairs: int) -> np.ndarray:
    """The records to measure: all of them when the pairs fit the limit, else a uniform sample
    sized so that its expected pairs do."""
    if pairs <= PAIR_LIMIT:
        return np.arange(size, dtype=np.int64)
    count = size * PAIR_LIMIT // pairs
    return np.sort(np.random.default_rng(_SAMPLE_SEED).choice(size, size=count, replace=False))


def sample_note(size: int, pairs: int, measured: int) -> tuple[str, ...]:
    """The limit a sampled measurement stays within, in words (nothing when all were measured)."""
    if measured == size:
        return ()
    return (
        (
            f"batch-mate diversity measured exactly on a uniform sample of {measured} of {size} records: "
            f"all records would take {pairs} (record, batch mate) pairs, more than the limit of {PAIR_LIMIT}"
        ),
    )


def count_mates(size: int, epochs: list[FedBatches], measured: np.ndarray) -> np.ndarray:
    """Distinct batch mates of each ``measured`` record (sorted) over all ``epochs``."""
    mates = np.zeros(len(measured), dtype=np.int64)
    if len(measured) == 0:
        return mates
    located = [_locate(epoch, measured) for epoch in epochs]
    load = np.zeros(len(measured), dtype=np.int64)
    for rows, batches, _, sizes in located:
        np.add.at(load, rows, sizes[batches])
    bounds = np.searchsorted(np.cumsum(load), np.arange(_CHUNK_PAIRS, int(load.sum()), _CHUNK_PAIRS))
    edges = np.unique(np.concatenate([[0], bounds, [len(measured)]]))
    for first, stop in zip(edges[:-1].tolist(), edges[1:].tolist()):
        mates[first:stop] = _chunk_mates(size, epochs, located, measured, first, stop)
    return mates


def _locate(epoch: FedBatches, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the measured records occur: (row in ``measured``, batch), sorted by row, and the batches."""
    batch_of = np.repeat(np.arange(len(epoch.batch_sizes)), epoch.batch_sizes)
    row = np.searchsorted(measured, epoch.records)
    hit = (row < len(measured)) & (measured[np.minimum(row, len(measured) - 1)] == epoch.records)
    order = np.argsort(row[hit], kind="stable")
    starts = np.concatenate([[0], np.cumsum(epoch.batch_sizes)[:-1]]).astype(np.int64)
    return row[hit][order], batch_of[hit][order], starts, epoch.batch_sizes.astype(np.int64)


def _chunk_mates(
    size: int,
    epochs: list[FedBatches],
    located: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    measured: np.ndarray,
    first: int,
    stop: int,
) -> np.ndarray:
    keys = []
    for epoch, (rows, batches, starts, sizes) in zip(epochs, located):
        lo, hi = np.searchsorted(rows, [first, stop])
        rows_here, batches_here = rows[lo:hi] - first, batches[lo:hi]
        lengths = sizes[batches_here]
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        mate = epoch.records[np.repeat(starts[batches_here], lengths) + offsets].astype(np.int64)
        row = np.repeat(rows_here, lengths)
        other = mate != measured[first:stop][row]
        keys.append(row[other] * size + mate[other])
    pairs = np.sort(np.concatenate(keys))  # np.unique's hash path is many times slower here
    first_of_pair = np.ones(len(pairs), dtype=bool)
    first_of_pair[1:] = pairs[1:] != pairs[:-1]
    return np.bincount(pairs[first_of_pair] // size, minlength=stop - first)


def summarise(size: int, measured: np.ndarray, mates: np.ndarray) -> BatchMates:
    """Minimum, maximum, the least mixed records and a histogram over [0, maximum] in integer bins
    (not over [0, N-1]: after a few epochs of a large N every record sits far below N-1)."""
    lowest = np.lexsort((measured, mates))[:_LOWEST]
    top = int(mates.max()) + 1
    edges = np.unique(np.linspace(0, top, min(_HISTOGRAM_BINS, top) + 1).astype(np.int64))
    counts = np.histogram(mates, bins=edges)[0]
    return BatchMates(
        records_measured=len(measured),
        exact=len(measured) == size,
        minimum=int(mates.min()),
        maximum=int(mates.max()),
        mean=float(mates.mean()),
        reaching_all=int(np.count_nonzero(mates == size - 1)),
        lowest=tuple((int(measured[i]), int(mates[i])) for i in lowest),
        histogram=tuple(
            HistogramBin(low=int(low), high=int(high) - 1, records=int(count))
            for low, high, count in zip(edges[:-1], edges[1:], counts)
        ),
    )
