"""``stop_certificate`` takes the writer off every core hook: a process (or a test) that recorded once leaves no
observer behind for the fits and loaders that follow."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import DataLoader

from stateful_sampler import ResumableLoader, StatefulSampler, plugins
from stateful_sampler.certificate import read_run, record_certificate, stop_certificate


def test_stop_certificate_leaves_no_hook_and_records_nothing_more(tmp_path: Path) -> None:
    before = plugins.trainer_observers()
    prefix = tmp_path / "run.cert"
    record_certificate(prefix)
    assert len(plugins.trainer_observers()) == len(before) + 1
    recorded = [
        batch.tolist()
        for batch in ResumableLoader(DataLoader(range(8), sampler=StatefulSampler(8, seed=3), batch_size=4))
    ]
    stop_certificate()
    assert plugins.trainer_observers() == before
    [
        batch.tolist()
        for batch in ResumableLoader(DataLoader(range(8), sampler=StatefulSampler(8, seed=4), batch_size=4))
    ]
    assert [step.records() for step in read_run(prefix).steps] == recorded
