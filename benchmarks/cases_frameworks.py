"""Issue 12: how long the HF ``Trainer`` takes to resume at a late step, with its own batch skipping and with
``ResumableTrainer``'s O(1) restore. ``python -m benchmarks.cases_frameworks`` prints the result as JSON.

Both resume from the same checkpoint (one written after step 1, its trainer state moved to a late step of
the epoch) and stop after one more step; the figure is the time from ``train()`` to that step's start,
which holds everything a resume costs: loading the checkpoint and, for the stock Trainer, fetching and
discarding every batch of the epoch before the step (``skip_first_batches``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from torch.utils.data import Dataset

from stateful_sampler import StatefulSampler
from stateful_sampler.loader import LOADER_STATE_VERSION

STOCK = "HF Trainer (skips the epoch's batches up to the step)"
OURS = "ours: ResumableTrainer"
FRESH = "ours: ResumableTrainer, fresh start (no resume)"


class Tokens(Dataset):
    """A cheap sample (a few integer ops), so the skip's cost is the Trainer's loop over batches, not I/O."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.tensor([(index * 7 + 3 * step) % 64 for step in range(8)])
        return {"input_ids": tokens, "labels": tokens}


def _trainer(trainer_class: type, root: Path, dataset: Dataset, max_steps: int, callbacks: list[Any]) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    config = GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(output_dir=str(root), use_cpu=True, per_device_train_batch_size=32, max_steps=max_steps,
                             save_strategy="steps", save_steps=1, logging_strategy="no", report_to="none",
                             disable_tqdm=True, seed=0)  # fmt: skip
    torch.manual_seed(0)
    return trainer_class(model=GPT2LMHeadModel(config), args=args, train_dataset=dataset, callbacks=callbacks)


def hf_resume(size: int, step: int) -> dict[str, Any]:
    """Seconds from ``train(resume_from_checkpoint=...)`` to the start of step ``step + 1``, each way, and from a
    fresh ``train()`` to its first step (what a resume costs at least)."""
    from transformers import Trainer, TrainerCallback

    from stateful_sampler.hf_trainer import STATE_FILE, ResumableTrainer

    class FirstStep(TrainerCallback):
        started: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.started = self.started or perf_counter()

    dataset = Tokens(size)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        _trainer(Trainer, root / "seed", dataset, 1, []).train()
        checkpoint = root / "run" / f"checkpoint-{step}"
        shutil.copytree(root / "seed" / "checkpoint-1", checkpoint)
        state_path = checkpoint / "trainer_state.json"
        state = json.loads(state_path.read_text())
        state_path.write_text(json.dumps({**state, "global_step": step}))
        sampler = StatefulSampler(dataset, seed=0, batch_size=32)
        loader_state = {"version": LOADER_STATE_VERSION, "sampler": sampler.state_dict(consumed_batches=step)}
        (checkpoint / STATE_FILE).write_text(json.dumps(loader_state))
        runs = ((STOCK, Trainer, checkpoint), (OURS, ResumableTrainer, checkpoint), (FRESH, ResumableTrainer, None))
        for name, trainer_class, resume in runs:
            first = FirstStep()
            trainer = _trainer(trainer_class, root / name[:4], dataset, step + 1 if resume else 1, [first])
            start = perf_counter()
            trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
            seconds[name] = first.started - start  # type: ignore[operator]
    return {"size": size, "step": step, "batches_per_epoch": -(-size // 32), "seconds": seconds}


if __name__ == "__main__":
    print(json.dumps(hf_resume(size=10**7, step=300_000), indent=2))
