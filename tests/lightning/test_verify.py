"""``stateful-sampler verify`` and ``assert_resume_equal``: pass on a correct setup, and on a broken
one fail with the first divergent step; plus the comparison and fingerprint on their own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from stateful_sampler.testing import assert_resume_equal
from stateful_sampler.verify.cli import EXIT_RUN_FAILED, main
from stateful_sampler.verify.compare import compare_runs
from stateful_sampler.verify.fingerprint import batch_fingerprint, batch_indices
from stateful_sampler.verify.recorder import BatchRecord, RunRecord, read_run
from tests.lightning.verify_harness import digits_config

# digits_config: 2 epochs of 29 steps, a checkpoint every 10 steps; killed after 25, resumed from 20.
KILL_AT, RESUMED_FROM = 25, 20


# verify on a correct setup: test_crash.py, whose single-process crash test shares its runs.


@pytest.mark.slow
def test_verify_refuses_a_config_without_sampler_checkpoint_before_any_training(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # Without the callback the resume would be refused (the guard), after a whole uninterrupted training
    # and a killed one: verify says so at the start of the first run, before its first batch.
    config = digits_config(tmp_path, sampler_checkpoint=False)
    arguments = ["--config", str(config), "--kill-at", str(KILL_AT), "--work-dir", str(tmp_path / "work")]
    assert main(arguments) == EXIT_RUN_FAILED
    captured = capsys.readouterr()  # verify's reasons go to stderr, its report to stdout
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == (
        f"verify could not complete: config '{config}': trainer.callbacks: the train dataloader draws from a "
        "StatefulSampler, but SamplerCheckpoint is not among the Trainer's callbacks: without it Lightning cannot "
        "resume the sampler exactly, and the resumed run would be refused. Add {class_path: "
        "stateful_sampler.lightning.SamplerCheckpoint} to trainer.callbacks"
    )
    assert read_run(tmp_path / "work" / "reference" / "reference").batches == []  # refused before the first batch
    assert not (tmp_path / "work" / "crash" / "killed.log").exists()


@pytest.mark.slow
def test_assert_resume_equal_names_an_augmentation_divergence(tmp_path: Path, one_thread: None) -> None:
    # Same indices, but the noise comes from worker RNG streams that a resume restarts.
    config = digits_config(tmp_path, data_class="tests.lightning.verify_harness.UnseededDigitsDataModule")
    with pytest.raises(AssertionError) as raised:
        assert_resume_equal(config, kill_at=KILL_AT)
    message = str(raised.value)
    assert f"first divergence at step {RESUMED_FROM} (epoch 0, batch {RESUMED_FROM}), rank 0" in message
    assert ": the augmentation differs" in message


@pytest.mark.slow
def test_verify_requires_a_step_based_last_checkpoint(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    config_path = digits_config(tmp_path)
    config = yaml.safe_load(config_path.read_text())
    config["trainer"]["callbacks"] = config["trainer"]["callbacks"][:1]  # SamplerCheckpoint only
    config_path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(config_path)]) == EXIT_RUN_FAILED
    reason = capsys.readouterr().err.splitlines()[-1]
    assert reason.startswith(
        f"verify could not complete: config '{config_path}': trainer.callbacks: verify needs a step-based "
        "ModelCheckpoint that keeps last.ckpt"
    )


def test_verify_names_a_missing_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--config", str(tmp_path / "nope.yaml")]) == EXIT_RUN_FAILED
    assert f"config: no LightningCLI YAML config at '{tmp_path / 'nope.yaml'}'" in capsys.readouterr().err


def test_verify_refuses_a_kill_step_below_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = digits_config(tmp_path)
    assert main(["--config", str(config), "--kill-at", "0"]) == EXIT_RUN_FAILED
    assert "kill_at must be at least 1, got 0" in capsys.readouterr().err


def test_verify_refuses_a_work_dir_that_holds_a_verification(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = digits_config(tmp_path)
    (tmp_path / "work" / "reference").mkdir(parents=True)
    assert main(["--config", str(config), "--work-dir", str(tmp_path / "work")]) == EXIT_RUN_FAILED
    assert f"work_dir: '{tmp_path / 'work'}' already holds a verification" in capsys.readouterr().err


# -- could not run: exit 2 and one line that says why (issue 9, items 10 and 11)


def test_verify_exits_2_with_one_line_on_a_malformed_yaml(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("trainer: [unclosed\n  max_epochs: 1\n")
    assert main(["--config", str(config)]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err == (
        f"verify could not complete: config: '{config}' is not valid YAML: "
        "expected ',' or ']', but got ':' at line 2, column 13\n"
    )


@pytest.mark.slow
def test_verify_exits_2_when_kill_at_is_before_the_first_checkpoint(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # 1 epoch of ceil(1797 / 256) = 8 steps, a checkpoint every 3: a kill after step 2 leaves nothing to resume.
    config = digits_config(tmp_path, max_epochs=1, batch_size=256, every_n_train_steps=3, num_workers=0)
    assert main(["--config", str(config), "--kill-at", "2"]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err.splitlines()[-1] == (
        "verify could not complete: kill_at must be at least 3 (the first checkpoint's step) and at most 7 "
        "(the last step of the run), got 2"
    )


@pytest.mark.slow
def test_verify_shows_a_missing_class_in_one_line(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    config = digits_config(tmp_path)
    config.write_text(config.read_text().replace("model.DigitsClassifier", "model.NoSuchClassifier"))
    assert main(["--config", str(config)]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"verify could not complete: config '{config}': model: class_path "
        "'stateful_sampler.demo.model.NoSuchClassifier' cannot be used: "
        "module 'stateful_sampler.demo.model' has no attribute 'NoSuchClassifier'"
    )


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf"])
def test_verify_refuses_a_timeout_that_is_not_a_finite_number_above_0(
    tmp_path: Path, capsys: pytest.CaptureFixture, timeout: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(digits_config(tmp_path)), "--timeout", timeout])
    assert exited.value.code == EXIT_RUN_FAILED
    assert capsys.readouterr().err.splitlines()[-1] == (
        "stateful-sampler verify: error: argument --timeout: "
        f"expected a finite number of seconds above 0, got '{timeout}'"
    )


def test_verify_names_a_work_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = digits_config(tmp_path)
    assert main(["--config", str(config), "--work-dir", str(config)]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err == (
        f"verify could not complete: work_dir: '{config}' is a file, not a directory; pass a new or empty directory\n"
    )


def test_assert_resume_equal_names_run_when_it_is_neither_a_path_nor_a_command() -> None:
    message = r"^run must be a LightningCLI config path \(str or os.PathLike\) or a command \(a list of str\), got NoneType None$"
    with pytest.raises(TypeError, match=message):
        assert_resume_equal(None)  # type: ignore[arg-type]


def test_assert_resume_equal_names_a_work_dir_that_is_a_file(tmp_path: Path) -> None:
    config = digits_config(tmp_path)
    with pytest.raises(ValueError, match=r"^work_dir: '.*digits.yaml' is a file, not a directory; pass a new or empty"):
        assert_resume_equal(config, work_dir=config)


def test_assert_resume_equal_names_a_work_dir_under_a_file(tmp_path: Path) -> None:
    config = digits_config(tmp_path)
    message = r"^work_dir: cannot make a directory in '.*digits.yaml/runs': Not a directory$"
    with pytest.raises(ValueError, match=message):
        assert_resume_equal(config, work_dir=config / "runs")


# -- the comparison, on hand-made records


def _batch(step: int, fingerprint: str = "", rank: int = 0, indices: list[int] | None = None) -> BatchRecord:
    return BatchRecord(rank, step // 4, step % 4, step, fingerprint or f"f{step}-{rank}", indices)


def _run(steps: range, checkpoints: list[int], weight: float | None = 1.0) -> RunRecord:
    weights = None if weight is None else {"w": torch.tensor([weight])}
    return RunRecord([_batch(step) for step in steps], checkpoints, weights)


REFERENCE = _run(range(8), [4, 8])


def test_compare_accepts_a_prefix_plus_a_resume_that_replays_from_the_checkpoint() -> None:
    report = compare_runs(REFERENCE, _run(range(6), [4], None), _run(range(4, 8), [8]), kill_at=6)
    assert (report.equal, report.resumed_from, report.batches_compared, report.identical_batches) == (True, 4, 8, 8)


def test_compare_reports_the_earliest_divergence_in_training_order() -> None:
    resumed = _run(range(4, 8), [8])
    resumed.batches[3] = _batch(7, "late")
    resumed.batches[1] = _batch(5, "early", indices=[3, 1])
    reference = replace(REFERENCE, batches=[*REFERENCE.batches[:5], _batch(5, indices=[1, 3]), *REFERENCE.batches[6:]])
    report = compare_runs(reference, _run(range(5), [4], None), resumed, kill_at=5)
    assert report.first_divergence == (
        "step 5 (epoch 1, batch 1), rank 0: the resumed run trained on another batch than the uninterrupted run\n"
        "  expected fingerprint f5-0, got early\n"
        "  expected indices [1, 3]\n"
        "  got indices      [3, 1]"
    )
    assert report.identical_batches == 6


def test_compare_points_to_seeded_dataset_when_the_records_are_right_and_their_augmentation_is_not() -> None:
    resumed = _run(range(4, 8), [8])
    resumed.batches[1] = _batch(5, "noise of a restarted worker", indices=[1, 3])
    reference = replace(REFERENCE, batches=[*REFERENCE.batches[:5], _batch(5, indices=[1, 3]), *REFERENCE.batches[6:]])
    report = compare_runs(reference, _run(range(5), [4], None), resumed, kill_at=5)
    assert report.first_divergence == (
        "step 5 (epoch 1, batch 1), rank 0: the resumed run trained on another batch than the uninterrupted run\n"
        "  expected fingerprint f5-0, got noise of a restarted worker\n"
        "  same indices [1, 3]: the augmentation differs. A dataset that draws its own augmentation (torch.rand, "
        "np.random, random in __getitem__) takes it from its DataLoader worker's RNG stream, which a resume (or "
        "another worker count) starts over: wrap it in stateful_sampler.seeding.SeededDataset(dataset), which "
        "seeds each record's draws from (seed, epoch, index); if it is one already, a generator the dataset "
        "builds itself is not seeded: define load_sample(index, rng) and draw from rng.numpy or rng.torch"
    )


def test_compare_reports_batches_no_run_trained_on() -> None:
    report = compare_runs(REFERENCE, _run(range(6), [4], None), _run(range(4, 7), [8]), kill_at=6)
    assert report.first_divergence == (
        "step 7 (epoch 1, batch 3), rank 0: neither the killed nor the resumed run trained on this batch"
    )


def test_compare_reports_a_resume_that_started_over() -> None:
    report = compare_runs(REFERENCE, _run(range(6), [4], None), _run(range(8), [4, 8]), kill_at=6)
    assert report.first_divergence == (
        "the resumed run started from the beginning (epoch 0, batch 0), not at the last checkpoint (step 4): "
        "the run did not resume from it"
    )


def test_compare_reports_a_run_killed_before_any_checkpoint() -> None:
    report = compare_runs(REFERENCE, _run(range(3), [], None), _run(range(8), [4, 8]), kill_at=3)
    assert report.first_divergence == (
        "the killed run wrote no checkpoint before step 3: kill later or checkpoint more often"
    )


def test_compare_reports_weights_that_differ_in_the_last_bit() -> None:
    nudged = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
    report = compare_runs(REFERENCE, _run(range(6), [4], None), _run(range(4, 8), [8], nudged), kill_at=6)
    assert report.first_divergence is None
    assert report.weight_divergence == "final weight 'w' differs: max |difference| 1.19e-07"
    assert not report.equal


# -- the fingerprint


_values_and_order = st.lists(st.integers(-(10**6), 10**6), min_size=2, max_size=16, unique=True).flatmap(
    lambda values: st.tuples(st.just(values), st.permutations(range(len(values))))
)


@given(_values_and_order)
def test_fingerprint_changes_with_order_and_values(values_and_order: tuple[list[int], list[int]]) -> None:
    values, shuffled = values_and_order
    assume(shuffled != sorted(shuffled))
    features = torch.tensor(values, dtype=torch.float32)
    batch = [features, torch.arange(len(values))]
    order = torch.tensor(shuffled)
    assert batch_fingerprint(batch) == batch_fingerprint([features.clone(), torch.arange(len(values))])
    assert batch_fingerprint(batch) != batch_fingerprint([features[order], batch[1][order]])
    nudged = features.clone()
    nudged[0] = torch.nextafter(nudged[0], torch.tensor(float("inf")))
    assert batch_fingerprint(batch) != batch_fingerprint([nudged, batch[1]])


def test_fingerprint_tells_dtypes_and_shapes_apart() -> None:
    zeros = torch.zeros(4, dtype=torch.int32)
    variants = [zeros, zeros.float(), zeros.reshape(2, 2), zeros.to(torch.int64), [zeros], (zeros,), {"x": zeros}]
    assert len({batch_fingerprint(variant) for variant in variants}) == len(variants)


def test_indices_come_from_a_collated_sample_key_anywhere_in_the_batch() -> None:
    from stateful_sampler import SampleKey

    keys = SampleKey(torch.tensor([5, 2]), torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([0, 1]),
                     torch.tensor([False, False]))  # fmt: skip
    assert batch_indices([(torch.zeros(2), torch.ones(2)), keys]) == [5, 2]
    assert batch_indices({"image": torch.zeros(2), "key": keys}) == [5, 2]
    assert batch_indices([torch.zeros(2), torch.ones(2)]) is None
