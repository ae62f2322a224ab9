"""ResumableTrainer honours train_sampling_strategy="group_by_length" through LengthGrouped, and takes a strategy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch

from stateful_sampler import LengthGrouped, StatefulSampler, Weighted
from stateful_sampler.hf_trainer import ResumableTrainer

LENGTHS = [1 + index * 7 % 13 for index in range(40)]


class Ragged(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.arange(LENGTHS[index]), "labels": torch.arange(LENGTHS[index])}


def _trainer(root: Path, strategy=None, **arguments) -> ResumableTrainer:
    config = transformers.GPT2Config(vocab_size=16, n_positions=16, n_embd=8, n_layer=1, n_head=1)
    args = transformers.TrainingArguments(output_dir=str(root), use_cpu=True, per_device_train_batch_size=4,
                                          report_to="none", disable_tqdm=True, seed=3, **arguments)  # fmt: skip
    return ResumableTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Ragged(),
                            strategy=strategy)  # fmt: skip


def test_group_by_length_orders_with_length_grouped_over_the_dataset_s_lengths(tmp_path: Path) -> None:
    sampler = _trainer(tmp_path, train_sampling_strategy="group_by_length")._get_train_sampler()
    assert isinstance(sampler.strategy, LengthGrouped) and sampler.strategy.batch_size == 4
    expected = StatefulSampler(40, seed=3, batch_size=4, strategy=LengthGrouped(LENGTHS))
    assert list(sampler) == list(expected)


def test_a_strategy_is_taken_and_a_second_ordering_is_refused(tmp_path: Path) -> None:
    weights = np.arange(40) + 1.0
    sampler = _trainer(tmp_path, strategy=Weighted(weights, num_samples=40))._get_train_sampler()
    assert list(sampler) == list(StatefulSampler(40, seed=3, batch_size=4, strategy=Weighted(weights, num_samples=40)))
    with pytest.raises(ValueError, match="train_sampling_strategy='group_by_length' and strategy=.* both order"):
        _trainer(tmp_path, strategy=LengthGrouped(LENGTHS), train_sampling_strategy="group_by_length")
