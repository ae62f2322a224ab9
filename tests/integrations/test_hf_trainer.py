"""HF Transformers Trainer, 2 CPU processes (torchrun, gloo), a tiny GPT-2 from a config: examples/hf_trainer.py.

The SIGKILL mid-epoch and resume without replay, every batch and the final weights (dropout included)
against an uninterrupted run, is ``stateful-sampler verify`` on the example in tests/docs/test_examples.py; so is the
ranks' split of each epoch without overlap, asserted on the uninterrupted run verify makes there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integrations.harness import run

transformers = pytest.importorskip("transformers")
from stateful_sampler.hf_trainer import STATE_FILE, ResumableTrainer


def tiny_trainer(root: Path, **arguments: object) -> ResumableTrainer:
    import torch

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.tensor([index, index + 1]), "labels": torch.tensor([index, index + 1])}

    config = transformers.GPT2Config(vocab_size=16, n_positions=2, n_embd=8, n_layer=1, n_head=1, bos_token_id=0,
                                     eos_token_id=0)  # fmt: skip
    args = transformers.TrainingArguments(output_dir=str(root), use_cpu=True, per_device_train_batch_size=4,
                                          report_to="none", disable_tqdm=True, **arguments)  # fmt: skip
    return ResumableTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Pairs())


def test_a_checkpoint_without_the_sampler_state_is_refused_rather_than_replayed(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-5").mkdir()
    trainer = tiny_trainer(tmp_path)
    assert trainer.args.ignore_data_skip
    with pytest.raises(FileNotFoundError, match=rf"checkpoint-5/{STATE_FILE} is missing: resume_from_checkpoint must "
                       r"name a checkpoint written by ResumableTrainer"):  # fmt: skip
        trainer.train(resume_from_checkpoint=True)


def test_gradient_accumulation_that_does_not_divide_the_epoch_is_refused(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, gradient_accumulation_steps=2, dataloader_drop_last=False)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2 must divide the batches of an epoch \(3\)"):
        trainer.get_train_dataloader()


def test_another_train_sampling_strategy_is_refused_rather_than_silently_replaced(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train_sampling_strategy must be 'random' \(the default\) or "
                       r"'group_by_length', got 'sequential'"):  # fmt: skip
        tiny_trainer(tmp_path, train_sampling_strategy="sequential")


EPOCH_END_RUN = [
    "python",
    "-m",
    "torch.distributed.run",
    "--nproc-per-node",
    "2",
    "tests/integrations/hf_epoch_end_run.py",
]


def _summaries(record: Path) -> list[dict[str, int]]:
    import json

    return [json.loads((record / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_a_resume_from_an_epoch_end_checkpoint_agrees_on_max_steps_on_every_rank_and_trains_the_rest(
    tmp_path: Path,
) -> None:
    """Issue 17, item 7: 27 records on 2 ranks (pad: 14 a rank). After the checkpoint at the end of epoch 0 the
    ranks once computed max_steps 42 and 39 from len(loader) 14 and 13, and DDP hung. The resumed run starts from the
    uninterrupted run's checkpoint at the end of epoch 0 (a run of 1 epoch writes the same one: the Trainer recomputes
    max_steps from its arguments and len(loader) at every train(), whatever the checkpoint's trainer state says)."""
    uninterrupted = run([*EPOCH_END_RUN, str(tmp_path / "a"), "3"], tmp_path / "a-records")
    assert _summaries(tmp_path / "a-records") == [{"max_steps": 42, "global_step": 42}] * 2
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == [
        "checkpoint-14",
        "checkpoint-28",
        "checkpoint-42",
    ]

    shutil.copytree(tmp_path / "a" / "checkpoint-14", tmp_path / "b" / "checkpoint-14")
    resumed = run([*EPOCH_END_RUN, str(tmp_path / "b"), "3"], tmp_path / "b-records")  # hangs until TIMEOUT if not
    assert _summaries(tmp_path / "b-records") == [{"max_steps": 42, "global_step": 42}] * 2
    after_epoch_0 = {
        rank: [batch for batch in batches if batch["epoch"] > 0] for rank, batches in uninterrupted.records.items()
    }
    assert resumed.records == after_epoch_0  # every rank: epochs 1 and 2
    assert [len(batches) for batches in uninterrupted.records.values()] == [42, 42]
    assert [len(batches) for batches in resumed.records.values()] == [28, 28]
