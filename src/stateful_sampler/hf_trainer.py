"""HF Transformers ``Trainer``: resume from a checkpoint in O(1), without fast-forwarding the data.

On resume the stock ``Trainer`` replays the resumed epoch's first batches through the loader
(``skip_first_batches``): hours for a late step of a large epoch. ``ResumableTrainer`` trains on a
``StatefulSampler`` instead, saves the consumed position in each checkpoint folder and restores it
before the first batch, with ``ignore_data_skip`` on so that nothing is replayed.

Under DDP, ``accelerator.prepare`` wraps the train loader's batch sampler in a ``BatchSamplerShard``
that would shard the sampler's share a second time; it is made a pass-through, as the Trainer does
for its own rank-aware ``BatchRebalanceSampler``: the sampler shards, with its tail policy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sized
from pathlib import Path
from typing import Any, cast

from torch.utils.data import Dataset

from stateful_sampler.extras import missing_extra
from stateful_sampler.loader import ResumableLoader
from stateful_sampler.order.length_grouped import LengthGrouped
from stateful_sampler.order.strategy import Strategy
from stateful_sampler.sampler import StatefulSampler

try:
    from transformers import Trainer
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ModuleNotFoundError as error:
    raise missing_extra(error, "transformers", __name__) from error

STATE_FILE = "stateful_sampler.json"


class ResumableTrainer(Trainer):
    """A ``Trainer`` whose train data order is a ``StatefulSampler``'s, resumed exactly and in O(1).

    The sampler's seed is ``args.data_seed`` (else ``args.seed``). ``args.ignore_data_skip`` is set:
    the restored position replaces the Trainer's fast-forward. ``strategy=`` orders the data with any
    strategy (weighted, stratified, mixture, ...); ``train_sampling_strategy="group_by_length"`` uses
    ``LengthGrouped`` over HF's lengths, grouped by the global batch.

    Example::

        trainer = ResumableTrainer(model=model, args=args, train_dataset=dataset)   # instead of Trainer(...)
        trainer.train(resume_from_checkpoint=True)   # starts at the saved position: no batch is replayed
    """

    def __init__(self, *args: Any, strategy: Strategy | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sampling = getattr(self.args, "train_sampling_strategy", "random")
        if sampling not in ("random", "group_by_length"):
            raise ValueError(
                f"ResumableTrainer orders the train data with a StatefulSampler: train_sampling_strategy must be "
                f"'random' (the default) or 'group_by_length', got {sampling!r}"
            )
        if sampling == "group_by_length" and strategy is not None:
            raise ValueError(
                f"train_sampling_strategy='group_by_length' and strategy={strategy!r} both order the data: "
                f"pass one of them (LengthGrouped(lengths) is what group_by_length uses)"
            )
        self.strategy = strategy
        self.args.ignore_data_skip = True
        self._train_loader: ResumableLoader | None = None
        self._restored_state: dict[str, Any] | None = None

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # the Trainer resolves it the same way
        if isinstance(checkpoint, (str, os.PathLike)):
            path = Path(checkpoint) / STATE_FILE
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: resume_from_checkpoint must name a checkpoint written by ResumableTrainer "
                    f"(the Trainer would replay the data to its step instead)"
                )
            self._restored_state = json.loads(path.read_text())
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_train_sampler(self, train_dataset: Dataset | None = None) -> StatefulSampler:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        seed = self.args.seed if self.args.data_seed is None else self.args.data_seed
        strategy = self.strategy
        if getattr(self.args, "train_sampling_strategy", "random") == "group_by_length":
            strategy = LengthGrouped(self._lengths(dataset))  # the global batch comes from the sampler
        # the Trainer refuses a missing train_dataset before it asks for a sampler; torch types Dataset without __len__
        # private: the Trainer's per-device batch size as it batches the train loader (no public one)
        return StatefulSampler(cast(Sized, dataset), seed=seed, batch_size=self._train_batch_size, strategy=strategy)

    def _lengths(self, dataset: Any) -> list[int]:
        """Per-record lengths as HF's group_by_length takes them: the ``length_column_name`` column of a
        ``datasets.Dataset``, else the length of each record's first model input (``input_ids``)."""
        column = self.args.length_column_name
        if column in (getattr(dataset, "column_names", None) or ()):
            return list(dataset[column])
        names = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
        return [len(dataset[index][names[0]]) for index in range(len(dataset))]

    def get_train_dataloader(self) -> ResumableLoader:  # type: ignore[override]
        prepared = super().get_train_dataloader()
        shard = getattr(prepared, "batch_sampler", None)
        if getattr(shard, "num_processes", 1) > 1:
            shard.num_processes, shard.process_index, shard.even_batches = 1, 0, False  # type: ignore[union-attr]
        # epoch_sync: Accelerate's pass count; the Trainer saves and restores each process's RNG states itself
        loader = _TrainerLoader(prepared, epoch_sync=getattr(prepared, "set_epoch", None), rng_states=False)
        accumulation = self.args.gradient_accumulation_steps
        if len(loader) % accumulation:
            raise ValueError(
                f"gradient_accumulation_steps={accumulation} must divide the batches of an epoch ({len(loader)}): "
                f"the Trainer counts a resumed epoch's accumulation from its first batch"
            )
        if self._restored_state is not None:
            loader.load_state_dict(self._restored_state)
            self._restored_state = None
        self._train_loader = loader
        return loader

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the consumed position first: a folder whose trainer state is written then has it too."""
        if self._train_loader is not None and self.args.should_save:
            # private: the Trainer's own checkpoint folder, so the position lands beside its files
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / STATE_FILE).write_text(json.dumps(self._train_loader.state_dict()))
        super()._save_checkpoint(model, trial)


class _TrainerLoader(ResumableLoader):
    """The Trainer derives ``max_steps`` and the epoch it resumes in (``global_step // steps per epoch``) from
    ``len(loader)`` at the start of ``train``, and runs every epoch, the resumed one included, for that many
    batches. So its length is a whole epoch's batches on this rank, the same on every rank in step, not the
    rest of the pass a resumed loader has left (0 after a checkpoint at an epoch's end): a length that
    differs between ranks makes them disagree about ``max_steps`` and hangs DDP."""

    def __len__(self) -> int:
        records = len(self.sampler)
        batch = self.sampler.batch_size or 1
        return records // batch if self.drop_last else -(-records // batch)
