"""``accelerator.prepare(model, optimizer, loader)`` over a ``StatefulSampler`` loader on 2 processes, for
test_accelerate.py (issue 20, item 3). ``argv``: ``--record`` DIR. Each rank appends its batches to
DIR/rank{R}.jsonl, or writes the error ``prepare`` or the first batch raised to DIR/rank{R}.error."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler


def main(record: Path) -> None:
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    record.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(range(40), sampler=StatefulSampler(40, batch_size=4, seed=0), batch_size=4)
    try:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        with (record / f"rank{rank}.jsonl").open("w") as out:
            for batch in loader:
                ids = batch.tolist()
                out.write(json.dumps({"epoch": 0, "ids": ids, "padding": [False] * len(ids)}) + "\n")
    except Exception as error:  # noqa: BLE001 - the test reads it
        (record / f"rank{rank}.error").write_text(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")


if __name__ == "__main__":
    assert sys.argv[1] == "--record"
    main(Path(sys.argv[2]))
