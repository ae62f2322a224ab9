"""A tiny causal LM trained on packed rows, killed with SIGKILL mid-epoch and resumed exactly.

Two thousand synthetic documents (a noisy Markov chain over 64 tokens, built locally) are packed whole
into rows of 64 tokens by ``PackedRows(split_records=False)``; ``PackedDataset`` gives restarting
``position_ids``, labels masked at each document's first token and a block-diagonal causal mask, so no
token attends across documents. The loader has 2 workers and is wrapped in ``ResumableLoader``. One run
goes uninterrupted; a second is SIGKILLed after step 97, resumes from its checkpoint at step 90, and must
see the same rows in every batch and end with bitwise-identical weights.

    python examples/packed_lm.py [--split]     # --split: concatenate-and-cut rows (pre-training) instead
    stateful-sampler verify --kill-at 50 -- python examples/packed_lm.py --child {run_dir}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from stateful_sampler import PackedDataset, PackedRows, ResumableLoader
from stateful_sampler.verify import record_weights

VOCAB, SEQ_LEN, BATCH, DOCUMENTS = 64, 64, 8, 2000
EPOCHS, SAVE_EVERY, KILL_AFTER = 2, 10, 97


def documents() -> list[np.ndarray]:
    """Token sequences of log-normal length (1..64): each token follows the last by a fixed rule, with noise."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(2.6, 0.7, DOCUMENTS).astype(int), 1, SEQ_LEN)
    docs = []
    for length in lengths:
        tokens = [int(rng.integers(VOCAB))]
        for _ in range(length - 1):
            tokens.append((tokens[-1] * 5 + 3) % VOCAB if rng.random() < 0.9 else int(rng.integers(VOCAB)))
        docs.append(np.array(tokens))
    return docs


class TinyLM(nn.Module):
    """Token + position embeddings, one masked self-attention block, a linear head."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, width), nn.Embedding(SEQ_LEN, width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(input_ids) + self.positions(position_ids)
        q, k, v = self.qkv(hidden).chunk(3, dim=-1)
        hidden = hidden + self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return self.head(hidden + self.mlp(hidden))


def train(root: Path, split: bool, kill_after: int | None = None) -> None:
    """Train, resuming from ``root/checkpoint.pt`` if present; each consumed batch's (epoch, row) pairs go to
    ``root/batches.jsonl``. With ``kill_after``, the process SIGKILLs itself after that many steps."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    docs = documents()
    rows = PackedRows([len(d) for d in docs], SEQ_LEN, split_records=split, seed=3, batch_size=BATCH, window=512)
    packed = PackedDataset(docs, rows, attention="mask")
    loader = ResumableLoader(DataLoader(packed, sampler=rows, batch_size=BATCH, collate_fn=packed.collate,
                                        num_workers=2, persistent_workers=True))  # fmt: skip
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    checkpoint, record = root / "checkpoint.pt", root / "batches.jsonl"
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
        record.write_text("".join(record.read_text().splitlines(keepends=True)[:step]))  # drop the replayed steps
    with record.open("a") as out:
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            for batch in loader:
                logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"])
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                out.write(json.dumps([batch["epochs"].tolist(), batch["rows"].tolist(), round(loss.item(), 4)]) + "\n")
                out.flush()
                step += 1
                if step % SAVE_EVERY == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "loader": loader.state_dict(), "step": step}  # fmt: skip
                    torch.save(state, checkpoint)
                if step == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
    torch.save(model.state_dict(), root / "weights.pt")
    record_weights(model)  # for `stateful-sampler verify -- python examples/packed_lm.py --child {run_dir}`
    tokens = sum(len(d) for d in docs)
    (root / "summary.json").write_text(json.dumps({"rows": rows.rows_in_epoch(0), "tokens": tokens}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", action="store_true", help="concatenate and cut rows instead of packing whole")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kill-after", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        train(args.child, args.split, args.kill_after)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        whole, killed = Path(scratch) / "whole", Path(scratch) / "killed"
        command = [sys.executable, __file__, *(["--split"] if args.split else [])]
        for root in (whole, killed):
            root.mkdir()
        subprocess.run([*command, "--child", str(whole)], check=True)
        died = subprocess.run([*command, "--child", str(killed), "--kill-after", str(KILL_AFTER)], check=False)
        print(f"killed with SIGKILL after step {KILL_AFTER} (exit {died.returncode}); resuming from the checkpoint "
              f"at step {KILL_AFTER // SAVE_EVERY * SAVE_EVERY}")  # fmt: skip
        subprocess.run([*command, "--child", str(killed)], check=True)
        left, right = ((root / "batches.jsonl").read_text().splitlines() for root in (whole, killed))
        same = sum(a == b for a, b in zip(left, right))
        weights = [torch.load(root / "weights.pt") for root in (whole, killed)]
        identical = all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
        summary = json.loads((whole / "summary.json").read_text())
    efficiency = summary["tokens"] / (summary["rows"] * SEQ_LEN)
    print(f"{DOCUMENTS} documents, {summary['tokens']} tokens in {summary['rows']} rows of {SEQ_LEN}: "
          f"packing efficiency {efficiency:.1%}")  # fmt: skip
    print(f"first/last loss: {json.loads(left[0])[2]:.3f} / {json.loads(left[-1])[2]:.3f}")
    print(f"identical batches (rows and loss): {same} of {len(left)} (resumed run: {len(right)})")
    print(f"final weights bitwise identical: {identical}")
    return 0 if identical and same == len(left) == len(right) else 1


if __name__ == "__main__":
    sys.exit(main())
