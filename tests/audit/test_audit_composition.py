"""The audit's batch composition: per step and class against a target, the first batches, a chi-square test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_sampler import StatefulSampler
from stateful_sampler.audit import AuditConfig, audit
from stateful_sampler.audit.chisquare import chi_square, survival
from stateful_sampler.audit.cli import main
from stateful_sampler.order.curriculum import Curriculum
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMBALANCED = np.r_[np.zeros(95, dtype=np.int64), np.ones(5, dtype=np.int64)]


@settings(max_examples=200)
@given(statistic=st.floats(0, 5000), freedom=st.integers(1, 2))
def test_the_survival_function_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(
    statistic: float, freedom: int
) -> None:
    exact = math.erfc(math.sqrt(statistic / 2)) if freedom == 1 else math.exp(-statistic / 2)
    assert survival(statistic, freedom) == pytest.approx(exact, rel=1e-10, abs=1e-300)


def test_the_survival_function_matches_scipy_where_scipy_is_installed() -> None:
    stats = pytest.importorskip("scipy.stats")
    for freedom in (1, 3, 7, 30, 100, 999):
        for statistic in (0.01, 0.7, 3.0, 12.0, 40.0, 150.0, 900.0, 1300.0):
            assert survival(statistic, freedom) == pytest.approx(stats.chi2.sf(statistic, freedom), rel=1e-9)


def test_chi_square_counts_a_class_fed_against_a_zero_target_as_impossible() -> None:
    assert chi_square(np.array([10.0, 20.0, 30.0]), np.array([1.0, 1.0, 1.0]))[:2] == (10.0, 2)
    assert chi_square(np.array([5.0, 1.0]), np.array([1.0, 0.0])) == (math.inf, 0, 0.0)
    assert chi_square(np.array([5.0, 0.0]), np.array([1.0, 0.0])) == (0.0, 0, 1.0)


def test_each_step_counts_the_batches_of_all_ranks_against_the_labels_distribution() -> None:
    """No shuffle, 8 records on 2 ranks in batches of 2: step 0 is records 0, 2 (rank 0) and 1, 3 (rank 1)."""
    labels = [0, 0, 0, 1, 1, 1, 1, 1]  # target 3/8 and 5/8
    report = audit(AuditConfig(8, world_size=2, shuffle=False), batch_size=2, labels=labels, first_batches=1)
    (epoch,) = report.composition
    assert report.counts.composition[0].tolist() == [[3, 1], [0, 4]]
    assert (epoch.classes, epoch.target, epoch.fed, epoch.steps) == ((0, 1), (0.375, 0.625), (3, 5), 2)
    assert (epoch.max_step_deviation, epoch.worst_step) == (0.375, 0)  # step 0: 3/4 vs 3/8, and step 1 alike
    assert (epoch.first_steps, epoch.first_steps_deviation) == (1, 0.375)
    assert (epoch.chi_square, epoch.degrees_of_freedom, epoch.p_value) == (0.0, 1, 1.0)


def test_proportional_stratification_keeps_every_batch_closer_to_the_whole_than_a_uniform_shuffle() -> None:
    common = {"num_replicas": 2, "rank": 0, "batch_size": 5, "seed": 3}
    uniform = audit(StatefulSampler(100, **common), labels=IMBALANCED, epochs=3)
    stratified = audit(StatefulSampler(100, strategy=Stratified(IMBALANCED), **common), labels=IMBALANCED, epochs=3)
    # Prefix bound: each batch of 10 holds 9 or 10 of class 0 (target 9.5), so at most 0.05 off.
    assert max(epoch.max_step_deviation for epoch in stratified.composition) == pytest.approx(0.05)
    assert max(epoch.max_step_deviation for epoch in uniform.composition) > 0.1
    assert all(epoch.p_value == 1.0 for epoch in stratified.composition + uniform.composition)  # permutations


def test_weighted_draws_pass_the_chi_square_test_against_their_target_and_fail_it_against_another() -> None:
    weights = np.where(IMBALANCED == 1, 19.0, 1.0)  # half of the mass on the 5 minority records
    sampler = StatefulSampler(100, strategy=Weighted(weights, num_samples=4000), batch_size=50, seed=1)
    right = audit(sampler, labels=IMBALANCED, target={0: 0.5, 1: 0.5}, epochs=2)
    wrong = audit(sampler, labels=IMBALANCED, target={0: 0.55, 1: 0.45}, epochs=2)
    assert all(epoch.p_value > 0.01 for epoch in right.composition)
    assert all(epoch.p_value < 1e-8 for epoch in wrong.composition)
    assert sum(right.composition[0].fed) == 4000


def test_the_audit_of_a_sampler_audits_its_own_strategy_on_every_rank() -> None:
    groups = np.repeat(np.arange(10), 3)
    template = StatefulSampler(30, strategy=Grouped(groups), num_replicas=3, rank=0, batch_size=2, seed=4)
    report = audit(template, labels=groups)
    step_groups = [np.flatnonzero(row).tolist() for row in report.counts.composition[0]]
    ranks = [StatefulSampler(30, strategy=Grouped(groups), num_replicas=3, rank=r, seed=4).indices() for r in range(3)]
    expected = [sorted({int(groups[i]) for rank in ranks for i in rank[2 * k : 2 * k + 2]}) for k in range(5)]
    assert step_groups == expected
    assert report.settings.strategy == "grouped"


def test_a_curriculum_audit_counts_only_the_active_bands_of_each_epoch() -> None:
    bands = np.arange(30) % 3
    sampler = StatefulSampler(30, strategy=Curriculum(bands, schedule=[1, 2, 3]), batch_size=5)
    report = audit(sampler, labels=bands, epochs=3)
    assert [epoch.fed for epoch in report.composition] == [(10, 0, 0), (10, 10, 0), (10, 10, 10)]
    assert [epoch.occurrences for epoch in report.epochs] == [10, 20, 30]


def test_bad_labels_or_targets_are_refused_naming_the_argument() -> None:
    config = AuditConfig(4)
    with pytest.raises(ValueError, match=r"^labels must have one entry per record: length 4, got 3$"):
        audit(config, batch_size=2, labels=[0, 1, 1])
    with pytest.raises(ValueError, match=r"^target names classes with no labelled record: \[7\]$"):
        audit(config, batch_size=2, labels=[0, 1, 1, 0], target={7: 1.0})
    with pytest.raises(ValueError, match=r"^target must give finite, non-negative shares with a positive sum"):
        audit(config, batch_size=2, labels=[0, 1, 1, 0], target={0: -1.0})


def test_the_command_line_audits_a_strategy_from_label_files_with_composition_and_picture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "labels.npy", IMBALANCED)
    picture = tmp_path / "composition.png"
    args = ["--labels", str(tmp_path / "labels.npy"), "--strategy", "stratified", "--mode", "balanced",
            "--batch-size", "4", "--epochs", "2", "--json", "--plot", str(picture)]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["strategy"] == "stratified" and data["settings"]["size"] == 100
    assert [epoch["target"] for epoch in data["composition"]] == [[0.5, 0.5], [0.5, 0.5]]
    assert [epoch["max_step_deviation"] for epoch in data["composition"]] == [0.0, 0.0]  # 2 of each class a batch
    assert picture.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--strategy", "grouped", "--batch-size", "2", "--size", "4"],
            "--strategy grouped needs --labels FILE.npy (its groups, one per record)",
        ),
        (
            ["--strategy", "weighted", "--labels", "{labels}", "--batch-size", "2"],
            "--strategy weighted needs --weights FILE.npy (one weight per record)",
        ),
        (
            ["--weights", "{labels}", "--batch-size", "2", "--size", "100"],
            "--weights applies to --strategy weighted only, not uniform",
        ),
        (
            ["--labels", "{labels}", "--size", "99", "--batch-size", "2"],
            "--labels must have one entry per record: length 99, got 100",
        ),
        (["--labels", str(Path("missing.npy")), "--batch-size", "2"], "--labels: no such file: missing.npy"),
    ],
)
def test_bad_strategy_flags_exit_2_naming_the_flag(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "labels.npy", IMBALANCED)
    assert main([arg.replace("{labels}", str(tmp_path / "labels.npy")) for arg in args]) == 2
    assert capsys.readouterr().err == f"stateful-sampler audit: error: {message}\n"


def test_a_composition_table_too_large_to_hold_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stateful_sampler.audit.composition.MAX_CELLS", 11)
    message = (r"^labels has 4 classes over 3 steps in epoch 0: 12 counts, more than the 11 the composition holds; "
               r"give labels fewer classes \(e.g. group ids folded into bins\)$")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        audit(AuditConfig(12), batch_size=4, labels=np.arange(12) % 4)
    assert audit(AuditConfig(12), batch_size=4, labels=np.arange(12) % 3).composition[0].steps == 3
