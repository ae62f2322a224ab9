"""A plain training loop with 2 DataLoader workers, run as its own process by the resume tests.

It records every batch it consumes, can stop after some steps and save the consumed position,
and can start from a saved state.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler

RECORDS, BATCH, EPOCHS = 50, 8, 3  # 7 batches an epoch (the last one short)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    args = parser.parse_args()

    torch.manual_seed(1234)  # must not matter: the order never comes from the global RNG
    sampler = StatefulSampler(RECORDS, seed=42, batch_size=BATCH)
    if args.load:
        sampler.load_state_dict(json.loads(args.load.read_text()))
    loader = DataLoader(torch.arange(RECORDS), sampler=sampler, batch_size=BATCH, num_workers=2)
    seen: list[list[int]] = []
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader, 1):
            seen.append(batch.tolist())
            if len(seen) == args.stop_after:
                args.save.write_text(json.dumps(sampler.state_dict(consumed_batches=step)))
                args.record.write_text(json.dumps(seen))
                return
    args.record.write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
