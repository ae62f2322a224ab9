"""Lightning with ``SamplerCheckpoint`` resumes every non-uniform strategy exactly, from mid-epoch and end-of-epoch
checkpoints, including epochs whose length a curriculum's schedule changes, a mixture's weight schedule, and passes
longer than the dataset (weighted and balanced draws)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from stateful_sampler import StatefulSampler
from stateful_sampler.order.curriculum import Curriculum
from stateful_sampler.order.grouped import Grouped
from stateful_sampler.order.length_grouped import LengthGrouped
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.strategy import Strategy
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted
from tests.lightning.lightning_harness import WORKERS, IndexDataset, RecordingModel, SaveAt, Setup, fit

STRATEGIES = {  # 22 records; Setup's batch is 4 on one device
    "grouped": lambda: Grouped(np.arange(22) * 5 % 6, shuffle_within=True),
    "curriculum": lambda: Curriculum(np.arange(22) % 3, schedule=[1, 2, 3]),  # 8, 15, 22 records
    "mixture": lambda: Mixture([3, 8, 11], [0.5, 0.3, 0.2], num_samples=18, schedule={2: [1, 1, 1]}),
    "length-grouped": lambda: LengthGrouped(np.arange(22) * 7 % 10, batch_size=4, megabatch=2, longest_first=True),
    "weighted": lambda: Weighted(np.arange(22) % 4 + 1.0, num_samples=30),
    "stratified-proportional": lambda: Stratified(np.arange(22) % 5 // 4),  # 18 and 4 records
    "stratified-balanced": lambda: Stratified(np.arange(22) % 5 // 4, mode="balanced"),  # 36 draws a pass
}


class StrategyModel(RecordingModel):
    strategy: Strategy

    def _train_loader(self, size: int, seed: int) -> DataLoader:
        dataset: Dataset = IndexDataset(size)
        sampler = StatefulSampler(dataset, seed=seed, tail=self.setup_.tail, batch_size=self.setup_.batch_size,
                                  strategy=self.strategy)  # fmt: skip
        loader = self.setup_.loader(dataset, sampler)
        self.train_loaders.append(loader)
        return loader


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_resume_from_each_checkpoint_sees_the_uninterrupted_batches(name: str, workers: int, tmp_path: Path) -> None:
    model_class = type("Model", (StrategyModel,), {"strategy": STRATEGIES[name]()})
    setup = Setup(num_workers=workers)
    save = SaveAt(tmp_path, after_batches=(1, 3, 6, 9), after_epochs=(0, 1))
    uninterrupted = fit(setup, [save], model_class=model_class)
    assert len(save.saved) == 6
    assert uninterrupted.record != fit(setup, model_class=RecordingModel).record  # the strategy took effect
    for checkpoint in save.saved.values():
        assert fit(setup, ckpt_path=checkpoint, model_class=model_class).record == uninterrupted.record, checkpoint.name
