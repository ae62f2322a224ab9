"""The audit against brute force: counts taken from iterating the real ``DataLoader`` pipeline."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from stateful_sampler import KeyedDataset, StatefulSampler
from stateful_sampler.audit import AuditConfig, audit, mates
from stateful_sampler.audit.report import Duplicate, Occurrence, RankBatches


@dataclass(frozen=True)
class Run:
    size: int
    world_size: int
    batch_size: int
    tail: str
    drop_last: bool
    shuffle: bool
    order: str
    seed: int
    epochs: int
    start_epoch: int

    def config(self) -> AuditConfig:
        return AuditConfig(self.size, self.world_size, self.seed, self.shuffle, self.tail, self.order)

    def loader(self, rank: int, num_workers: int = 0) -> DataLoader:
        sampler = StatefulSampler(
            self.size,
            shuffle=self.shuffle,
            seed=self.seed,
            num_replicas=self.world_size,
            rank=rank,
            tail=self.tail,
            order=self.order,
            batch_size=self.batch_size,
            yield_keys=True,
        )
        dataset = KeyedDataset(list(range(self.size)))
        return DataLoader(
            dataset, sampler=sampler, batch_size=self.batch_size, drop_last=self.drop_last, num_workers=num_workers
        )


def fed_batches(run: Run, epoch: int, rank: int, num_workers: int = 0) -> list[tuple[list[int], list[bool], list[int]]]:
    """(records, is_padding, pass) of each batch one rank's real loader yields in an epoch."""
    loader = run.loader(rank, num_workers)
    loader.sampler.set_epoch(epoch)
    return [(records.tolist(), keys.is_padding.tolist(), keys.epoch.tolist()) for records, keys in loader]


def drawn(run: Run, epoch: int, rank: int) -> list:
    """Every key the sampler hands the loader in the epoch, cut or not."""
    sampler = run.loader(rank).sampler
    sampler.set_epoch(epoch)
    return list(sampler)


def brute_force_epoch(run: Run, epoch: int) -> dict:
    batches = [fed_batches(run, epoch, rank) for rank in range(run.world_size)]
    fed = [(record, padding, pass_) for rank in batches for b in rank for record, padding, pass_ in zip(*b)]
    counts = Counter(record for record, _, _ in fed)
    padding = Counter(record for record, is_padding, _ in fed if is_padding)
    keys = [drawn(run, epoch, rank) for rank in range(run.world_size)]
    cut = []
    for rank, (rank_keys, rank_batches) in enumerate(zip(keys, batches)):
        fed_count = sum(len(b[0]) for b in rank_batches)
        cut += [Occurrence(rank, key.index, key.is_padding) for key in rank_keys[fed_count:]]
    in_epoch = {key.index for rank_keys in keys for key in rank_keys}
    return {
        "occurrences": len(fed),
        "distinct": len(counts),
        "padding": sum(padding.values()),
        "duplicates": tuple(Duplicate(r, n, padding[r]) for r, n in sorted(counts.items()) if n > 1),
        "dropped_by_tail": tuple(sorted(set(range(run.size)) - in_epoch)) if run.tail == "drop" else (),
        "dropped_by_batch": tuple(cut),
        "ranks": tuple(
            RankBatches(rank, len(keys[rank]), len(b), len(b[-1][0]) if b else 0) for rank, b in enumerate(batches)
        ),
        "carried_in": tuple(sorted({key.index for k in keys for key in k if key.epoch < epoch})),
        "carried_over": carried_over(run, epoch),
        "batches": [b[0] for rank in batches for b in rank],
        "counts": counts,
    }


def carried_over(run: Run, epoch: int) -> tuple[int, ...]:
    """Records of this epoch's pass or earlier ones that later epochs draw (carry): every later epoch
    starts at most one global batch G before its pass, so ceil(G/N) + 1 epochs ahead cover them."""
    if run.tail != "carry":
        return ()
    ahead = -(-run.world_size * run.batch_size // run.size) + 1
    later = range(epoch + 1, epoch + 1 + ahead)
    return tuple(
        sorted(k.index for e in later for r in range(run.world_size) for k in drawn(run, e, r) if k.epoch <= epoch)
    )


def brute_force_mates(size: int, batches: list[list[int]]) -> np.ndarray:
    met = [set() for _ in range(size)]
    for batch in batches:
        for record in batch:
            met[record].update(batch)
    return np.array([len(others - {record}) for record, others in enumerate(met)])


runs = st.builds(
    Run,
    size=st.integers(1, 40),
    world_size=st.integers(1, 4),
    batch_size=st.integers(1, 7),
    tail=st.sampled_from(["pad", "drop", "uneven", "carry"]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    order=st.sampled_from(["fast", "torch"]),
    seed=st.integers(0, 2**63 - 1),  # default_collate cannot batch SampleKey.seed >= 2**63 (reported to the lead)
    epochs=st.integers(1, 3),
    start_epoch=st.integers(0, 3),
).filter(lambda run: run.tail != "drop" or run.size >= run.world_size)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs)
def test_audit_counts_equal_a_brute_force_count_of_the_real_dataloader(run: Run):
    report = audit(
        run.config(), batch_size=run.batch_size, drop_last=run.drop_last, epochs=run.epochs, start_epoch=run.start_epoch
    )
    total = Counter()
    all_batches = []
    cumulative = set()
    for epoch_report, epoch in zip(report.epochs, range(run.start_epoch, run.start_epoch + run.epochs)):
        expected = brute_force_epoch(run, epoch)
        total.update(expected["counts"])
        all_batches += expected["batches"]
        cumulative |= set(expected["counts"])
        assert epoch_report.epoch == epoch
        for name in (
            "occurrences",
            "distinct",
            "padding",
            "duplicates",
            "dropped_by_tail",
            "dropped_by_batch",
            "ranks",
            "carried_in",
            "carried_over",
        ):
            assert getattr(epoch_report, name) == expected[name], name
        assert epoch_report.unseen == run.size - expected["distinct"]
        steps = {rank.batches for rank in expected["ranks"]}
        assert epoch_report.equal_steps == (len(steps) == 1)
        sizes = [rank.last_batch_size for rank in expected["ranks"]]
        assert epoch_report.single_sample_batches == tuple(r for r, n in enumerate(sizes) if n == 1)
        assert epoch_report.short_batches == tuple(r for r, n in enumerate(sizes) if 0 < n < run.batch_size)
    assert report.cumulative_distinct[-1] == len(cumulative)
    assert report.never_seen == tuple(sorted(set(range(run.size)) - set(total)))
    per_record = [total[record] for record in range(run.size)]
    assert (report.occurrences_min, report.occurrences_max) == (min(per_record), max(per_record))
    assert report.occurrence_histogram == dict(sorted(Counter(per_record).items()))
    expected_mates = brute_force_mates(run.size, all_batches)
    assert report.counts.mates.tolist() == expected_mates.tolist()
    assert (report.batch_mates.minimum, report.batch_mates.maximum) == (expected_mates.min(), expected_mates.max())


def test_past_the_pair_limit_a_stated_sample_of_records_is_measured_each_exactly(monkeypatch):
    monkeypatch.setattr(mates, "PAIR_LIMIT", 500)
    monkeypatch.setattr(mates, "_CHUNK_PAIRS", 64)  # several chunks, so chunk edges are exercised
    run = Run(
        size=60,
        world_size=2,
        batch_size=5,
        tail="pad",
        drop_last=False,
        shuffle=True,
        order="fast",
        seed=3,
        epochs=3,
        start_epoch=0,
    )
    report = audit(run.config(), batch_size=5, epochs=3)
    pairs = 3 * 2 * 6 * 25
    assert report.batch_mates.records_measured == 60 * 500 // pairs and not report.batch_mates.exact
    assert report.limits == (
        (
            f"batch-mate diversity measured exactly on a uniform sample of {60 * 500 // pairs} of 60 records: "
            f"all records would take {pairs} (record, batch mate) pairs, more than the limit of 500"
        ),
    )
    batches = [b for epoch in range(3) for b in brute_force_epoch(run, epoch)["batches"]]
    expected = brute_force_mates(60, batches)
    measured = np.flatnonzero(report.counts.mates >= 0)
    assert len(measured) == report.batch_mates.records_measured
    assert report.counts.mates[measured].tolist() == expected[measured].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("tail", ["pad", "carry"])
def test_worker_processes_change_no_batch(tail):
    """Why ``num_workers`` is only reported: real worker processes yield the very batches 0 workers do."""
    run = Run(
        size=23,
        world_size=2,
        batch_size=4,
        tail=tail,
        drop_last=False,
        shuffle=True,
        order="fast",
        seed=11,
        epochs=2,
        start_epoch=0,
    )
    for epoch in range(2):
        for rank in range(2):
            assert fed_batches(run, epoch, rank, num_workers=2) == fed_batches(run, epoch, rank, num_workers=0)
    with_workers = audit(run.config(), batch_size=4, epochs=2, num_workers=2)
    assert with_workers.epochs == audit(run.config(), batch_size=4, epochs=2).epochs
    assert with_workers.settings.num_workers == 2
