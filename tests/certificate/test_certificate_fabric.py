"""The certificate under Lightning Fabric: ``fabric.save`` takes the loader's state (a checkpoint record) and
``fabric.load`` restores it (the resume record), through the core's hooks, with nothing of the certificate in
the loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from stateful_sampler import StatefulSampler
from stateful_sampler.certificate import compare, read_run
from stateful_sampler.certificate.plugin import hooked
from stateful_sampler.certificate.writer import CertificateWriter

pytest.importorskip("lightning")


def fabric_process(prefix: Path, checkpoint: Path, steps: int | None, save_at: int = 0) -> list[list[int]]:
    from lightning.fabric import Fabric

    from stateful_sampler.fabric import setup_dataloader

    fabric = Fabric(accelerator="cpu", devices=1)
    loader = setup_dataloader(fabric, DataLoader(range(20), sampler=StatefulSampler(20, seed=5), batch_size=4))
    remove = hooked(CertificateWriter(prefix, loader.sampler))
    trained: list[list[int]] = []
    try:
        if checkpoint.exists():
            fabric.load(checkpoint, {"loader": loader})
        while loader.epoch < 2 and (steps is None or len(trained) < steps):
            for batch in loader:
                trained.append(batch.tolist())
                if len(trained) == save_at:
                    fabric.save(checkpoint, {"loader": loader})
                if steps is not None and len(trained) >= steps:
                    break
    finally:
        remove()
    return trained


def test_fabric_save_and_load_are_certified(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    expected = fabric_process(plain, tmp_path / "none.pt", None)
    killed, checkpoint = tmp_path / "killed", tmp_path / "checkpoint.pt"
    before = fabric_process(killed, checkpoint, steps=7, save_at=6)  # epoch 1, one step in; step 6 is lost
    after = fabric_process(killed, checkpoint, None)
    assert before[:6] + after == expected
    run = read_run(killed)
    assert [step.records() for step in run.steps] == expected
    assert [(start["start_step"], start["restored"]) for start in run.starts] == [(0, False), (6, True)]
    comparison = compare(read_run(plain), run)
    assert (comparison.code, comparison.rule) == (0, "step by step"), comparison.report()
