"""A training loop under ``Preemption``, 2 DataLoader workers, run as its own process by tests/core/test_preemption.py.

Protocol on stdout, one line per event, flushed: ``trained <batch>`` after each optimizer step,
``handed <batch>`` for a batch the (wrong) top-of-loop check got and did not train on,
``requeue <job id>`` from the injected requeue action, ``done`` when the run finished. With
``--handshake`` the loop reads one line from stdin after each step: the test signals the process
at a step it chose, then lets it go on, so the signal lands mid-run without a sleep.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler
from stateful_sampler.preemption import Preemption

RECORDS, BATCH, EPOCHS = 40, 4, 2  # 10 steps an epoch, 20 in all


def make_loader(workers: int) -> ResumableLoader:
    sampler = StatefulSampler(RECORDS, seed=11, batch_size=BATCH)
    return ResumableLoader(DataLoader(torch.arange(RECORDS), sampler=sampler, batch_size=BATCH, num_workers=workers))


def emit(event: str, payload: object = "") -> None:
    print(event, json.dumps(payload) if payload != "" else "", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--check", choices=("steps", "bottom", "top"), default="steps")
    parser.add_argument("--exit-code", type=int, default=75)
    parser.add_argument("--handshake", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)  # plain SGD, written out: a torch.optim step imports torch._dynamo (2 s CPU)
    loader = make_loader(workers=2)
    if args.state.exists():
        loader.load_state_dict(json.loads(args.state.read_text()))

    def train(batch: torch.Tensor) -> None:
        loss = model(batch.float()[:, None]).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
        emit("trained", batch.tolist())
        if args.handshake:
            sys.stdin.readline()

    def save_and_exit(preempt: Preemption) -> None:
        args.state.write_text(json.dumps(loader.state_dict()))
        preempt.exit_for_requeue()

    signals = (signal.SIGUSR1, signal.SIGTERM)
    with Preemption(signals, exit_code=args.exit_code, requeue=lambda job: emit("requeue", job)) as preempt:
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            if args.check == "steps":  # the documented way: the iteration stops at the boundary
                for batch in preempt.steps(loader):
                    train(batch)
                if preempt.requested:
                    save_and_exit(preempt)
            elif args.check == "bottom":  # a hand-written check after the optimizer step: exact too
                for batch in loader:
                    train(batch)
                    if preempt.requested:
                        save_and_exit(preempt)
            else:  # at the top of the body: the batch was handed out (counted) and is not trained on
                for batch in loader:
                    if preempt.requested:
                        emit("handed", batch.tolist())
                        save_and_exit(preempt)
                    train(batch)
    emit("done")


if __name__ == "__main__":
    main()
