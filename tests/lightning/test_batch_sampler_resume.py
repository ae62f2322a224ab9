"""Issue 25, item 15: ``SamplerCheckpoint`` over ``DataLoader(ds, batch_sampler=TokenBudgetBatches(...))``. It
stopped at the start of training ("(DataLoader with SequentialSampler) has no StatefulSampler"): the batch
sampler is itself the StatefulSampler, at ``loader.batch_sampler``. A resume from each checkpoint, and one after
SIGKILL, sees exactly the batches of the uninterrupted fit (harness: lightning_harness.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stateful_sampler import TokenBudgetBatches
from tests.helpers import run_ranks
from tests.lightning.lightning_harness import WORKERS, IndexDataset, RecordingModel, SaveAt, Setup, fit
from tests.lightning.stop_modes import TIMEOUT, every_4_steps

LENGTHS = np.random.default_rng(0).integers(1, 12, 40)  # 40 records of 1-11 tokens
MAX_TOKENS = 24  # padded: longest x count <= 24, so 2 to 24 records a batch
BUDGET_SETUP = Setup(size=len(LENGTHS), batch_size=1, max_epochs=3, dropout=0.5)


class BudgetModel(RecordingModel):
    """Trains on token-budget batches of ``IndexDataset``: each step records the indices of its batch."""

    def _train_loader(self, size: int, seed: int) -> torch.utils.data.DataLoader:
        batches = TokenBudgetBatches(LENGTHS, max_tokens=MAX_TOKENS, window=8, seed=seed)
        loader = torch.utils.data.DataLoader(IndexDataset(size), batch_sampler=batches,
                                             num_workers=self.setup_.num_workers)  # fmt: skip
        self.train_loaders.append(loader)
        return loader


def epochs_of(model: RecordingModel) -> list[list[int]]:
    """The uninterrupted fit's records, epoch by epoch: each epoch every record once."""
    by_epoch: dict[int, list[int]] = {}
    for epoch, batch in zip(model.epochs, model.record):
        by_epoch.setdefault(epoch, []).extend(batch)
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


@pytest.mark.parametrize("workers", WORKERS)
def test_lightning_resumes_token_budget_batches_exactly_from_each_checkpoint(workers: int, tmp_path: Path) -> None:
    setup = BUDGET_SETUP.with_(num_workers=workers)
    save = SaveAt(tmp_path, after_batches=(3, 8), after_epochs=(0,))
    uninterrupted = fit(setup, [save], model_class=BudgetModel)
    assert len(save.saved) == 3 and len(uninterrupted.record) > 8
    assert [sorted(records) for records in epochs_of(uninterrupted)] == [list(range(len(LENGTHS)))] * 3
    assert len({len(batch) for batch in uninterrupted.record}) > 1  # batches of several sizes
    assert epochs_of(uninterrupted)[0] != epochs_of(uninterrupted)[1]  # each epoch its own order
    for name, checkpoint in save.saved.items():
        resumed = fit(setup, ckpt_path=checkpoint, model_class=BudgetModel)
        assert resumed.record == uninterrupted.record, name
        assert torch.equal(resumed.layer.weight, uninterrupted.layer.weight), name


KILLED_WORKERS = (0, 2)


@pytest.fixture(scope="module")
def killed_fits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """killed_budget_run.py once for every worker count: one launch of Lightning, each fit SIGKILLed in a
    forked child of its own; ``directory/workers<N>`` holds its checkpoints."""
    directory = tmp_path_factory.mktemp("killed-budget")
    script = Path(__file__).with_name("killed_budget_run.py")
    killed = subprocess.run([sys.executable, str(script), str(directory), *map(str, KILLED_WORKERS)],
                            start_new_session=True, capture_output=True, text=True, timeout=2 * TIMEOUT,
                            check=False)  # fmt: skip
    assert killed.returncode == 0, killed.stdout + killed.stderr[-3000:]
    assert killed.stdout.splitlines() == [f"workers{workers}: {-signal.SIGKILL}" for workers in KILLED_WORKERS], (
        killed.stdout + killed.stderr[-3000:]
    )
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("workers", KILLED_WORKERS)
def test_a_fit_over_token_budget_batches_killed_with_sigkill_resumes_exactly(workers: int, killed_fits: Path) -> None:
    setup = BUDGET_SETUP.with_(num_workers=workers)
    uninterrupted = fit(setup, model_class=BudgetModel)
    directory = killed_fits / f"workers{workers}"
    checkpoint: dict[str, Any] = torch.load(directory / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 8 and len(checkpoint["records"][0]) == 8  # mid-epoch 0 (17 batches)
    resumed = fit(setup, [every_4_steps(directory)], ckpt_path="last", model_class=BudgetModel,
                  enable_checkpointing=True)  # fmt: skip
    assert resumed.record == uninterrupted.record
    assert resumed.epochs == uninterrupted.epochs[8:]
    assert torch.equal(resumed.layer.weight, uninterrupted.layer.weight)
    assert torch.equal(resumed.layer.bias, uninterrupted.layer.bias)


DDP_SCRIPT = Path(__file__).with_name("ddp_budget_run.py")


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Both ranks of ddp_budget_run.py, once: per use_distributed_sampler mode, each rank's report."""
    from tests.lightning.ddp_budget_run import MODES

    out = tmp_path_factory.mktemp("ddp-budget")
    run_ranks([sys.executable, str(DDP_SCRIPT), str(out)], 2, DDP_SCRIPT.parents[2], timeout=300,
              rank_variable="LOCAL_RANK", env={"NODE_RANK": "0"})  # fmt: skip
    errors = sorted(path.name for path in out.glob("*.error"))
    assert errors == [], (out / errors[0]).read_text() if errors else ""
    return {mode: [json.loads((out / f"{mode}_rank{rank}.json").read_text()) for rank in (0, 1)] for mode in MODES}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "off"])
def test_under_ddp_lightning_keeps_the_batch_sampler_and_every_rank_resumes_exactly(
    mode: str, ddp_reports: dict[str, list[dict[str, Any]]]
) -> None:
    """With use_distributed_sampler left on, Lightning rebuilt the loader around a DistributedSampler of its own
    and failed: TokenBudgetBatches.__init__() got an unexpected keyword argument 'batch_size'."""
    ranks = ddp_reports[mode]
    for rank, report in enumerate(ranks):
        assert report["loader_kept"] is True
        assert report["batch_sampler"] == ["TokenBudgetBatches", 2, rank]
        assert set(report["resumed"]) == {"batch3", "epoch0"}
        for name, record in report["resumed"].items():
            assert record == report["record"], (rank, name)
            assert report["resumed_weights"][name] == report["weights"], (rank, name)
    assert [len(report["record"]) for report in ranks] == [len(ranks[0]["record"])] * 2  # equal steps
    for epoch in (0, 1):  # the ranks together take every record each epoch (padding repeats a few)
        taken = {index for report in ranks for step, batch in zip(report["epochs"], report["record"]) if step == epoch
                 for index in batch}  # fmt: skip
        assert taken == set(range(len(LENGTHS))), epoch
