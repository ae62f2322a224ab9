"""Pre-training on a mixture of corpora packed into rows of 256 tokens, its weights changed twice mid-run.

Two corpora are map-style (lists of documents in memory: "books" and "code"), the third ("web") is streamed from
parquet shards that the example writes under ``--root``. ``MixedStream`` draws documents from the three at weights
5:2:3; ``PackedStream`` concatenates the drawn documents and cuts them into rows of 256 tokens (``position_ids``
restarting at each document, a block-diagonal causal mask, labels masked at each document's first token).

The weights change twice, each corpus going on through its own order where it stood:

- by hand, at a resume: after step 10 (a checkpoint) the run goes on under another mixture, with a fourth corpus
  ("math") appended: the state saved under the first mixture loads into ``MixedStream(..., on_change="continue")``,
  and the new weights take over at the end of the saved row's window of draws (``WINDOW``). The run does it in
  process; a run resumed from a later checkpoint builds the changed mixture at once, and its state says where the
  change was;
- planned, at 80% of the run: a ``schedule`` entry ``(epoch, position)`` anneals the weights towards "code".

The loader's state is saved with the model every 5 steps; run the command again and it resumes from the last
checkpoint, exactly, as ``stateful-sampler verify`` checks (SIGKILL, resume, EQUAL). At the end it prints each
corpus's share of the draws in each segment, against its weights (``audit_segments``).

    python examples/pretrain_mixture.py --root runs/pretrain   # trains (a few seconds); run it again: it resumes
    stateful-sampler verify --kill-at 12 -- python examples/pretrain_mixture.py --root {run_dir}

The model is a causal LM of about 3,400 parameters (one attention layer), trained by plain SGD on CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.nn import functional as F

from stateful_sampler import ResumableLoader
from stateful_sampler.audit.mixture import audit_segments
from stateful_sampler.stream import MixedStream, PackedStream, ParquetReader, ShardedStream
from stateful_sampler.verify import record_weights

VOCAB, SEQ_LEN, BATCH, WIDTH, LR = 64, 256, 4, 16, 2.0
DRAWS, EPOCHS, SAVE_EVERY, SEED = 400, 2, 5, 7  # documents drawn an epoch; the run is 2 epochs
WEIGHTS = [5, 2, 3]  # books, code, web
ANNEAL = {(1, 240): [2, 6, 2]}  # from position 240 of epoch 1 (draw 640 of the run's 800: 80%) on
RESTART = 10  # after this step (a checkpoint, mid-epoch 0) the run goes on under the mixture changed by hand:
CHANGED = [4, 2, 3, 1]  # books, code, web and "math", appended
CHANGED_ANNEAL = {(1, 240): [2, 5, 2, 1]}  # the planned anneal, over the four
RULES = {"books": (5, 3, 0.9), "code": (7, 1, 0.95), "web": (3, 11, 0.7), "math": (9, 5, 0.98)}  # next = (a*t + b) % V
DOCUMENTS = {"books": 240, "code": 160, "web": 320, "math": 80}
WEB_SHARDS = 8
WINDOW = 100  # draws packed together: a change at a resume takes effect at the end of the saved row's window


def corpus(name: str) -> list[dict[str, list[int]]]:
    """A corpus's documents: token sequences of log-normal length (4..400), each token following the last by the
    corpus's rule, with noise."""
    a, b, p = RULES[name]
    rng = np.random.default_rng(list(RULES).index(name))
    lengths = np.clip(rng.lognormal(3.6, 0.8, DOCUMENTS[name]).astype(int), 4, 400)
    documents = []
    for length in lengths.tolist():
        tokens = [int(rng.integers(VOCAB))]
        for _ in range(length - 1):
            tokens.append((a * tokens[-1] + b) % VOCAB if rng.random() < p else int(rng.integers(VOCAB)))
        documents.append({"input_ids": tokens})
    return documents


def web_shards(root: Path) -> list[str]:
    """The "web" corpus as parquet shards under ``root/web`` (written once: a resume reads the same files)."""
    folder = root / "web"
    paths = [folder / f"web-{index:02d}.parquet" for index in range(WEB_SHARDS)]
    if not all(path.exists() for path in paths):
        folder.mkdir(parents=True, exist_ok=True)
        documents = [document["input_ids"] for document in corpus("web")]
        for path, part in zip(paths, np.array_split(np.arange(len(documents)), WEB_SHARDS)):
            partial = path.with_suffix(".tmp")
            pq.write_table(pa.table({"input_ids": documents[part[0] : part[-1] + 1]}), partial, row_group_size=10)
            partial.replace(path)
    return [str(path) for path in paths]


def packed_rows(root: Path, changed: bool) -> PackedStream:
    """The pipeline: the corpora mixed, then packed; streams built without ranks (the rows are dealt). ``changed``:
    the mixture as changed by hand after step ``RESTART`` ("math" appended, other weights), which takes a state saved
    under the first one (``on_change="continue"``)."""
    web = ShardedStream(web_shards(root), ParquetReader(columns=["input_ids"]), batch_size=1, window=2, seed=SEED)
    corpora = [corpus("books"), corpus("code"), web]
    if changed:
        mixed = MixedStream([*corpora, corpus("math")], CHANGED, batch_size=1, num_samples=DRAWS,
                            schedule=CHANGED_ANNEAL, on_change="continue", seed=SEED)  # fmt: skip
    else:
        mixed = MixedStream(corpora, WEIGHTS, batch_size=1, num_samples=DRAWS, schedule=ANNEAL, seed=SEED)
    return PackedStream(
        mixed, SEQ_LEN, batch_size=BATCH, window=WINDOW, attention="mask", lengths_cache=root / "lengths"
    )


class TinyLM(nn.Module):
    """Token embeddings, a position embedding of the document position (capped), one masked self-attention layer and a
    linear head: about 3,400 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(32, WIDTH)
        self.qkv, self.head = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(input_ids) + self.positions(position_ids.clamp(max=31))
        q, k, v = self.qkv(hidden).chunk(3, dim=-1)
        return self.head(hidden + F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def train(root: Path) -> None:
    """Train, from ``root/checkpoint.pt`` if there is one; print each step's loss."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    checkpoint, step, state = root / "checkpoint.pt", 0, None
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        step, state = saved["step"], saved["loader"]
        print(f"resumed from step {step}", flush=True)
    while True:  # once, or twice when the run reaches RESTART: then on under the changed mixture, from its state
        rows = packed_rows(root, changed=step >= RESTART)
        loader = ResumableLoader(rows.loader(num_workers=2))
        if state is not None:
            loader.load_state_dict(state)
        for batch in epochs(loader):
            logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"])
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))
            model.zero_grad()
            loss.backward()
            with torch.no_grad():  # plain SGD, no optimizer state to save
                for parameter in model.parameters():
                    parameter -= LR * parameter.grad
            step += 1
            print(f"step {step} epoch {loader.epoch} loss {loss.item():.4f}", flush=True)
            if step % SAVE_EVERY == 0:
                save(checkpoint, {"model": model.state_dict(), "loader": loader.state_dict(), "step": step})
            if step == RESTART:
                break
        else:
            break
        state = loader.state_dict()
    record_weights(model)  # for `stateful-sampler verify -- python examples/pretrain_mixture.py --root {run_dir}`
    print(f"trained {step} steps of {BATCH} rows of {SEQ_LEN} tokens; each corpus's share of the draws:")
    first = packed_rows(root, changed=False).stream.mixture
    continued = rows.mixture  # the changed mixture, as the rows continued it
    print(audit_segments(first, continued, until=(EPOCHS, 0)).table(), flush=True)


def epochs(loader: ResumableLoader) -> Iterator[Any]:
    """The run's batches, epoch after epoch; a restored epoch goes on from its position."""
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
        yield from loader


def save(path: Path, state: dict[str, Any]) -> None:
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    partial.replace(path)  # whole or absent: a kill mid-save leaves the last checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="shards and checkpoints go here (default: a new temporary folder)")
    args = parser.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="pretrain-"))
    root.mkdir(parents=True, exist_ok=True)
    train(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
