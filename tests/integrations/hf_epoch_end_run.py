"""A 2-process ``ResumableTrainer`` run with no DataLoader workers, for test_hf_trainer.py (issue 17, item 7).

``argv``: output directory, number of epochs, ``--record`` directory. 27 records on 2 ranks in batches of 1 (``pad``:
14 a rank and epoch), a checkpoint at every epoch's end; resumes from the last checkpoint in the directory.
Each rank appends its consumed records to RECORD/rank{R}.jsonl and writes RECORD/rank{R}.json with the
``max_steps`` and ``global_step`` its Trainer ended with.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from stateful_sampler.hf_trainer import ResumableTrainer
from stateful_sampler.loader import add_batch_hook

warnings.filterwarnings("ignore")
SIZE = 27


class Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([index, index + 1]), "labels": torch.tensor([index, index + 1])}


def main(output: Path, epochs: int, record: Path) -> None:
    args = TrainingArguments(output_dir=str(output), use_cpu=True, per_device_train_batch_size=1,
                             num_train_epochs=epochs, save_strategy="epoch", logging_strategy="no", report_to="none",
                             disable_tqdm=True, dataloader_num_workers=0, ddp_backend="gloo", seed=0)  # fmt: skip
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=2, n_embd=8, n_layer=1, n_head=1, bos_token_id=0, eos_token_id=0)
    trainer = ResumableTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Pairs())
    rank = args.process_index
    record.mkdir(parents=True, exist_ok=True)
    out = (record / f"rank{rank}.jsonl").open("a")

    def write(loader, batch, consumed: int) -> None:  # type: ignore[no-untyped-def]
        ids = [int(first) for first in batch["input_ids"][:, 0]]
        out.write(json.dumps({"epoch": loader.epoch, "ids": ids, "padding": [False] * len(ids)}) + "\n")
        out.flush()

    add_batch_hook(write)
    resume = get_last_checkpoint(str(output)) if output.is_dir() else None
    trainer.train(resume_from_checkpoint=resume)
    summary = {"max_steps": trainer.state.max_steps, "global_step": trainer.state.global_step}
    (record / f"rank{rank}.json").write_text(json.dumps(summary))
    out.close()
    # End without the interpreter's teardown: torch 2.13's gloo group, destroyed while its worker thread is still
    # releasing the Trainer's last all_gather, deadlocks (destroy_process_group: the destructor holds the GIL the
    # thread waits for) or aborts the process (at exit: "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    assert sys.argv[3] == "--record"
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[4]))
