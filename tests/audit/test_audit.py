"""The coverage audit's exact figures on the cases of issue 6, and its errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from stateful_sampler import StatefulSampler
from stateful_sampler.audit import AuditConfig, audit
from stateful_sampler.audit.report import Duplicate, HistogramBin, Occurrence, RankBatches


def global_order(size: int, world_size: int, epoch: int = 0, **kwargs) -> list[int]:
    """The epoch's global order as the ranks interleave it: position p is rank p % W."""
    per_rank = [
        StatefulSampler(size, num_replicas=world_size, rank=r, **kwargs).indices(epoch) for r in range(world_size)
    ]
    return [int(per_rank[p % world_size][p // world_size]) for p in range(sum(map(len, per_rank)))]


def test_pad_feeds_12_occurrences_of_10_records_repeating_the_first_two_of_the_order():
    epoch = audit(AuditConfig(size=10, world_size=3, seed=5, tail="pad"), batch_size=4).epochs[0]
    first, second = global_order(10, 3, seed=5, tail="pad")[:2]
    assert (epoch.occurrences, epoch.distinct, epoch.padding, epoch.unseen) == (12, 10, 2, 0)
    assert epoch.duplicates == tuple(sorted([Duplicate(first, 2, 1), Duplicate(second, 2, 1)], key=lambda d: d.record))
    assert epoch.dropped_by_tail == () and epoch.dropped_by_batch == ()
    assert epoch.ranks == tuple(RankBatches(rank=r, samples=4, batches=1, last_batch_size=4) for r in range(3))


def test_pad_without_shuffle_repeats_records_0_and_1_like_distributed_sampler():
    epoch = audit(AuditConfig(size=10, world_size=3, shuffle=False), batch_size=4).epochs[0]
    assert epoch.duplicates == (Duplicate(0, 2, 1), Duplicate(1, 2, 1))


def test_torch_order_counts_match_torch_distributed_sampler():
    fed = [i for r in range(3) for i in DistributedSampler(range(10), num_replicas=3, rank=r, seed=7)]
    expected = tuple(Duplicate(int(i), 2, 1) for i in np.flatnonzero(np.bincount(fed) == 2))
    epoch = audit(AuditConfig(size=10, world_size=3, seed=7, order="torch"), batch_size=4).epochs[0]
    assert (epoch.occurrences, epoch.distinct, epoch.duplicates) == (12, 10, expected)
    assert expected == tuple(
        Duplicate(int(i), 2, 1)
        for i in sorted(torch.randperm(10, generator=torch.Generator().manual_seed(7))[:2].tolist())
    )


def test_drop_feeds_9_and_names_the_record_never_seen():
    report = audit(AuditConfig(size=10, world_size=3, seed=5, tail="drop"), batch_size=3)
    epoch = report.epochs[0]
    cut = global_order(10, 1, seed=5, tail="drop")[9]  # one rank takes the whole pass; 3 ranks cut its last record
    assert (epoch.occurrences, epoch.distinct, epoch.padding, epoch.unseen) == (9, 9, 0, 1)
    assert epoch.dropped_by_tail == (cut,)
    assert epoch.dropped_by_batch == () and epoch.duplicates == ()
    assert report.never_seen == (cut,)


def test_drop_without_shuffle_cuts_record_9():
    assert audit(AuditConfig(size=10, world_size=3, shuffle=False, tail="drop"), batch_size=3).never_seen == (9,)


def test_batches_of_3_with_drop_last_feed_9_and_name_the_cut_occurrences():
    order = global_order(10, 3, seed=5)
    epoch = audit(AuditConfig(size=10, world_size=3, seed=5), batch_size=3, drop_last=True).epochs[0]
    # Each rank holds 4 = 3 + 1: the last global positions 9, 10, 11 are cut; 10 and 11 are padding.
    assert (epoch.occurrences, epoch.distinct, epoch.padding) == (9, 9, 0)
    assert epoch.dropped_by_batch == (
        Occurrence(rank=0, record=order[9], is_padding=False),
        Occurrence(rank=1, record=order[0], is_padding=True),
        Occurrence(rank=2, record=order[1], is_padding=True),
    )
    assert epoch.dropped_by_tail == ()
    assert epoch.unseen == 1  # order[9]: its only occurrence was cut at the batch level
    assert [rank.batches for rank in epoch.ranks] == [1, 1, 1] and epoch.equal_steps


def test_tail_drop_and_batch_drop_last_are_separate_boundaries():
    epoch = audit(AuditConfig(size=10, world_size=3, shuffle=False, tail="drop"), batch_size=2, drop_last=True).epochs[
        0
    ]
    assert epoch.dropped_by_tail == (9,)
    assert epoch.dropped_by_batch == (Occurrence(0, 6, False), Occurrence(1, 7, False), Occurrence(2, 8, False))
    assert (epoch.occurrences, epoch.distinct, epoch.unseen) == (6, 6, 4)


def test_batch_of_one_is_flagged_as_the_batchnorm_hazard():
    report = audit(AuditConfig(size=9), batch_size=4)
    epoch = report.epochs[0]
    assert epoch.ranks == (RankBatches(rank=0, samples=9, batches=3, last_batch_size=1),)
    assert epoch.short_batches == (0,) and epoch.single_sample_batches == (0,)
    assert any("batch of 1 sample" in warning and "BatchNorm" in warning for warning in report.warnings)


def test_drop_last_removes_the_batchnorm_hazard():
    report = audit(AuditConfig(size=9), batch_size=4, drop_last=True)
    assert report.epochs[0].single_sample_batches == () and report.epochs[0].short_batches == ()
    assert report.epochs[0].dropped_by_batch[0].rank == 0 and report.epochs[0].occurrences == 8
    assert not any("BatchNorm" in warning for warning in report.warnings)


def test_uneven_tail_gives_unequal_step_counts_and_warns_of_the_ddp_hang():
    report = audit(AuditConfig(size=10, world_size=3, tail="uneven"), batch_size=2)
    epoch = report.epochs[0]
    assert [rank.batches for rank in epoch.ranks] == [2, 2, 2]
    report = audit(AuditConfig(size=10, world_size=3, tail="uneven"), batch_size=1)
    epoch = report.epochs[0]
    assert [rank.batches for rank in epoch.ranks] == [4, 3, 3] and not epoch.equal_steps
    assert (epoch.occurrences, epoch.distinct, epoch.duplicates) == (10, 10, ())
    assert any("unequal step counts (rank 0: 4, rank 1: 3, rank 2: 3)" in warning for warning in report.warnings)


def test_carry_rolls_the_remainder_into_the_next_epoch():
    # 10 records, 2 ranks of batch 2: global batch 4, so epoch 0 feeds 8 and carries 2 of pass 0.
    report = audit(AuditConfig(size=10, world_size=2, shuffle=False, tail="carry"), batch_size=2, epochs=3)
    first, second, third = report.epochs
    assert (first.occurrences, first.distinct, first.carried_in, first.carried_over) == (8, 8, (), (8, 9))
    assert (second.occurrences, second.carried_in, second.carried_over) == (12, (8, 9), ())
    assert second.distinct == 10 and second.duplicates == (Duplicate(8, 2, 0), Duplicate(9, 2, 0))
    assert (third.occurrences, third.carried_in, third.carried_over) == (8, (), (8, 9))
    assert report.cumulative_distinct == (8, 10, 10)


def test_carry_with_a_global_batch_larger_than_the_dataset_carries_whole_passes():
    report = audit(AuditConfig(size=5, world_size=2, shuffle=False, tail="carry"), batch_size=4, epochs=2)
    first, second = report.epochs
    assert (first.occurrences, first.carried_over) == (0, (0, 1, 2, 3, 4))
    assert (second.occurrences, second.carried_in, second.carried_over) == (8, (0, 1, 2, 3, 4), (3, 4))


def test_run_wide_figures_keep_occurrences_and_distinct_records_apart():
    report = audit(AuditConfig(size=10, world_size=3, seed=1), batch_size=2, epochs=3)
    assert report.occurrences_per_pass == 12.0 and report.distinct_per_pass == 10.0
    assert report.cumulative_distinct == (10, 10, 10) and report.never_seen == ()
    assert sum(report.occurrence_histogram.values()) == 10
    assert sum(times * records for times, records in report.occurrence_histogram.items()) == 36
    assert report.occurrences_min == min(report.occurrence_histogram)
    assert report.occurrences_max == max(report.occurrence_histogram)
    assert report.counts.occurrences.shape == (3, 10) and report.counts.occurrences.sum() == 36


def test_start_epoch_audits_the_later_epochs_of_the_same_order():
    whole = audit(AuditConfig(size=50, world_size=2, seed=3), batch_size=4, epochs=4)
    later = audit(AuditConfig(size=50, world_size=2, seed=3), batch_size=4, epochs=2, start_epoch=2)
    assert later.epochs == whole.epochs[2:]


def test_a_fixed_order_keeps_the_same_batch_mates_and_a_shuffle_meets_everyone():
    fixed = audit(AuditConfig(size=32, shuffle=False), batch_size=8, epochs=30).batch_mates
    shuffled = audit(AuditConfig(size=32, seed=0), batch_size=8, epochs=30).batch_mates
    assert (fixed.minimum, fixed.maximum, fixed.reaching_all, fixed.exact) == (7, 7, 0, True)
    assert shuffled.minimum >= 29 and shuffled.maximum == 31 and shuffled.exact
    assert sum(bin.records for bin in shuffled.histogram) == 32
    assert fixed.histogram[-1] == HistogramBin(low=7, high=7, records=32)  # bins end at the maximum
    assert [(b.low, b.high) for b in fixed.histogram] == [(m, m) for m in range(8)]


def test_a_live_sampler_is_audited_on_its_own_world_size_and_batch_size():
    sampler = StatefulSampler(10, num_replicas=3, rank=1, seed=5, batch_size=3)
    report = audit(sampler)
    assert (report.settings.world_size, report.settings.batch_size, report.settings.sampler_batch_size) == (3, 3, 3)
    assert report.epochs == audit(AuditConfig(size=10, world_size=3, seed=5), batch_size=3).epochs


def test_a_loader_batch_that_differs_from_the_sampler_batch_is_warned():
    sampler = StatefulSampler(10, seed=5, batch_size=3)
    assert any("differs from the loader's batch_size=4" in warning for warning in audit(sampler, batch_size=4).warnings)


def test_carry_with_another_sampler_batch_size_is_warned():
    report = audit(StatefulSampler(10, tail="carry", batch_size=3), batch_size=4)
    assert any("the sampler's batch_size=3 differs from the loader's batch_size=4" in w for w in report.warnings)
    assert report.epochs[0].ranks[0].last_batch_size == 1  # carry kept whole batches of 3, not of 4


def test_the_report_is_json_ready():
    report = audit(AuditConfig(size=10, world_size=3), batch_size=3, drop_last=True, epochs=2)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["epochs"][0]["dropped_by_batch"][1] == {
        "rank": 1,
        "record": report.epochs[0].dropped_by_batch[1].record,
        "is_padding": True,
    }
    assert data["settings"]["drop_last"] is True and "counts" not in data


def test_a_dict_of_config_fields_is_accepted():
    assert audit({"size": 10, "world_size": 3}, batch_size=3).epochs == audit(AuditConfig(10, 3), batch_size=3).epochs


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be at least 1 and at most 1073741824, got 0"),
        ({"batch_size": "3"}, TypeError, "batch_size must be an int"),
        ({"batch_size": None}, ValueError, "batch_size is required"),
        ({"epochs": 0}, ValueError, "epochs must be at least 1, got 0"),
        ({"num_workers": -1}, ValueError, "num_workers must be at least 0, got -1"),
        ({"start_epoch": -2}, ValueError, "start_epoch must be at least 0, got -2"),
        ({"drop_last": 1}, TypeError, "drop_last must be a bool"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    arguments = {"batch_size": 3, **kwargs}
    with pytest.raises(error, match=message):
        audit(AuditConfig(size=10, world_size=3), **arguments)


def test_more_ranks_than_records_under_drop_is_refused():
    with pytest.raises(ValueError, match=r"tail='drop' with 2 records on num_replicas=3 ranks would drop every record"):
        audit(AuditConfig(size=2, world_size=3, tail="drop"), batch_size=1)


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        (AuditConfig(size=10, world_size=0), ValueError, "world_size must be at least 1 and at most 65536, got 0"),
        (AuditConfig(size=10, tail="wrap"), ValueError, r"tail must be one of \['pad', 'drop', 'uneven', 'carry'\]"),
        (AuditConfig(size=-1), ValueError, "data_source"),
        ([1, 2, 3], TypeError, "sampler_or_config must be a StatefulSampler, an AuditConfig"),
    ],
)
def test_bad_configurations_are_named(config, error, message):
    with pytest.raises(error, match=message):
        audit(config, batch_size=3)


def test_too_many_occurrences_are_refused_rather_than_estimated():
    with pytest.raises(
        ValueError, match=r"size=20000000 over epochs=6 is 120000000 occurrences, more than the 100000000"
    ):
        audit(AuditConfig(size=20_000_000), batch_size=64, epochs=6)


# -- the audit's work is bounded (issue 9, item 8): refused before any work, naming the limit


def test_a_million_ranks_are_refused_naming_world_size_and_the_limit():
    with pytest.raises(ValueError, match=r"^world_size must be at least 1 and at most 65536, got 1000000$"):
        audit(AuditConfig(size=10, world_size=10**6), batch_size=1)


def test_a_live_sampler_on_a_million_ranks_is_refused_naming_the_limit():
    message = r"^world_size \(the sampler's num_replicas\) must be at least 1 and at most 65536, got 1000000$"
    with pytest.raises(ValueError, match=message):
        audit(StatefulSampler(10, num_replicas=10**6, rank=0), batch_size=1)


@pytest.mark.parametrize(("size", "world_size", "epochs"), [(10, 4096, 17), (1, 1, 65537), (0, 1, 10**9)])
def test_more_rank_epochs_than_the_limit_are_refused_naming_epochs_and_world_size(size, world_size, epochs):
    # (0, 1, 10**9): no record, so no occurrence limit, yet a billion epochs would run for days.
    message = (
        f"epochs={epochs} on world_size={world_size} ranks is {epochs * world_size} rank-epochs, more than the 65536 "
        "the audit computes per call: audit fewer epochs per call (start_epoch picks them)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        audit(AuditConfig(size=size, world_size=world_size), batch_size=1, epochs=epochs)


def test_the_rank_epoch_limit_admits_exactly_its_count(monkeypatch):
    monkeypatch.setattr("stateful_sampler.audit.setup.MAX_RANK_EPOCHS", 6)
    assert len(audit(AuditConfig(size=10, world_size=3), batch_size=2, epochs=2).epochs) == 2
    with pytest.raises(ValueError, match=r"^epochs=3 on world_size=3 ranks is 9 rank-epochs, more than the 6 "):
        audit(AuditConfig(size=10, world_size=3), batch_size=2, epochs=3)
    with pytest.raises(ValueError, match=r"^world_size must be at least 1 and at most 6, got 7$"):
        audit(AuditConfig(size=10, world_size=7), batch_size=2)


def test_an_epoch_whose_stream_positions_leave_int64_is_refused_naming_start_epoch():
    last = ((1 << 63) - 1 - 10 - 3) // 10  # the last epoch e with e * N + N + W below 2**63
    assert audit(AuditConfig(size=10, world_size=3), batch_size=2, start_epoch=last).epochs[0].occurrences == 12
    message = (
        f"start_epoch={last} with epochs=2 reaches epoch {last + 1}, past the last epoch {last} whose stream "
        "positions (epoch * size) fit in int64 for size=10"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        audit(AuditConfig(size=10, world_size=3), batch_size=2, start_epoch=last, epochs=2)


def test_a_loader_batch_size_beyond_int64_is_refused_naming_batch_size():
    message = r"^batch_size must be at least 1 and at most 9223372036854775807, got 9223372036854775808$"
    with pytest.raises(ValueError, match=message):
        audit(StatefulSampler(10), batch_size=1 << 63)
