"""HF Transformers ``Trainer``: resume from a checkpoint in O(1), with no batch replayed, on 1 or 2 CPU processes.

``ResumableTrainer`` is the ``Trainer`` with a ``StatefulSampler`` train order: each checkpoint
folder also holds the consumed position, and ``train(resume_from_checkpoint=True)`` starts there at
once instead of fast-forwarding the loader through the resumed epoch. A tiny GPT-2 built from a
config (random init, nothing downloaded) learns a synthetic sequence task.

    python examples/hf_trainer.py --root runs/hf                                   # one process
    torchrun --nproc-per-node 2 examples/hf_trainer.py --root runs/hf              # 2 CPU processes (gloo)
    torchrun --nproc-per-node 2 examples/hf_trainer.py --root runs/hf              # ...resumes from the last checkpoint
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from stateful_sampler.hf_trainer import ResumableTrainer
from stateful_sampler.loader import add_batch_hook
from stateful_sampler.verify import record_weights

SIZE, BATCH, LENGTH, VOCAB = 204, 6, 8, 256  # 17 batches a rank and epoch on 2 ranks


class Sequences(Dataset):
    """Record i: a sequence that starts with token i (so a batch names its records), then a fixed pattern."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.tensor([index] + [(index * 7 + 3 * step) % VOCAB for step in range(1, LENGTH)])
        return {"input_ids": tokens, "labels": tokens.clone()}


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def record_batches(directory: Path, rank: int) -> None:
    """Append the records of every consumed batch to DIR/rank{R}.jsonl (what the tests compare)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = (directory / f"rank{rank}.jsonl").open("a")

    def write(loader, batch, consumed: int) -> None:  # type: ignore[no-untyped-def]
        ids = batch["input_ids"][:, 0].tolist()
        out.write(json.dumps({"epoch": loader.epoch, "ids": ids, "padding": [False] * len(ids)}) + "\n")
        out.flush()

    add_batch_hook(write)


class KillAt(TrainerCallback):
    """Simulate a crash: SIGKILL rank 0 and its DataLoader workers after an optimizer step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == self.step and state.is_world_process_zero:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="checkpoints go to ROOT/checkpoint-STEP")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--kill-at", type=int, help="simulate a crash: SIGKILL process 0 after this optimizer step")
    parser.add_argument("--record", type=Path, help="append each consumed batch's record ids to DIR/rank{R}.jsonl")
    args = parser.parse_args(argv)

    training = TrainingArguments(
        output_dir=str(args.root), use_cpu=True, per_device_train_batch_size=BATCH, num_train_epochs=args.epochs,
        learning_rate=1e-3, seed=0, save_strategy="steps", save_steps=5, save_total_limit=2, logging_strategy="no",
        report_to="none", dataloader_num_workers=args.workers, disable_tqdm=True, ddp_backend="gloo",
    )  # fmt: skip
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)  # random init: nothing downloaded
    callbacks = [KillAt(args.kill_at)] if args.kill_at is not None else []
    trainer = ResumableTrainer(model=model, args=training, train_dataset=Sequences(), callbacks=callbacks)
    if args.record is not None:
        record_batches(args.record, training.process_index)
    resume = get_last_checkpoint(str(args.root)) if args.root.is_dir() else None
    if resume is not None and training.process_index == 0:
        print(f"resumed from step {resume.rsplit('-', 1)[1]}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    record_weights(trainer.model)  # for `stateful-sampler verify -- torchrun ... examples/hf_trainer.py ...`
    if training.process_index == 0:
        print(f"trained to step {trainer.state.global_step}; final weights {weights_digest(trainer.model)}")


if __name__ == "__main__":
    main()
