"""Demo: stop a training loop mid-epoch, resume in a fresh sampler, and check the batches match.

A plain PyTorch loop over a DataLoader with 2 worker processes: the workers prefetch ahead, so
the loop saves what it has *consumed* (``state_dict(consumed_batches=...)``), not what the
sampler has drawn.
"""

from __future__ import annotations

import json

import torch
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler

RECORDS, BATCH, EPOCHS, STOP_AT = 100, 8, 2, 17


def batches(sampler: StatefulSampler, stop_after: int | None = None) -> tuple[list[list[int]], dict | None]:
    loader = DataLoader(torch.arange(RECORDS), sampler=sampler, batch_size=BATCH, num_workers=2)
    seen: list[list[int]] = []
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader, 1):
            seen.append(batch.tolist())
            if len(seen) == stop_after:
                return seen, sampler.state_dict(consumed_batches=step)
    return seen, None


def main() -> None:
    uninterrupted, _ = batches(StatefulSampler(RECORDS, seed=7, batch_size=BATCH))
    before, state = batches(StatefulSampler(RECORDS, seed=7, batch_size=BATCH), stop_after=STOP_AT)
    saved = json.dumps(state)
    resumed_sampler = StatefulSampler(RECORDS, seed=7, batch_size=BATCH)
    resumed_sampler.load_state_dict(json.loads(saved))
    after, _ = batches(resumed_sampler)
    print(f"saved state ({len(saved)} bytes): {saved}")
    print(f"batches before the stop: {len(before)}, after the resume: {len(after)}, uninterrupted: {len(uninterrupted)}")
    same = before + after == uninterrupted
    print("verdict:", "IDENTICAL batches, in the same order" if same else "MISMATCH")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
