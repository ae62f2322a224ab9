"""Sample keys: what the sampler yields with ``yield_keys=True`` instead of a bare index.

A key says which record, from which pass of the order, at which global position, and whether
this occurrence only pads the ranks to equal length. It travels to the worker with the index,
so a dataset wrapper can mark padding in the batch and seed per-sample randomness from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch.utils.data import Dataset


class SampleKey(NamedTuple):
    index: int  # type: ignore[assignment]  # the record to load (a field, shadowing tuple.index, since 0.1.0)
    seed: int  # the sampler's seed
    epoch: int  # the pass whose permutation placed the record (the epoch, except carry's remainder)
    position: int  # global position within the epoch
    is_padding: bool  # a repeat that only evens out the ranks: exclude it from losses and metrics


class KeyedDataset(Dataset):
    """Wraps a map-style dataset for a sampler with ``yield_keys=True``.

    ``dataset[key]`` loads ``dataset[key.index]`` and returns ``(sample, key)``; the default
    collate turns the keys of a batch into one ``SampleKey`` of tensors, so a training step reads
    ``batch_keys.is_padding`` as its mask.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: SampleKey) -> tuple[Any, SampleKey]:
        return self.load(require_key(key, type(self).__name__)), key

    def load(self, key: SampleKey) -> Any:
        """Load one record; subclasses wrap this to act around the load."""
        return self.dataset[key.index]


def require_key(key: Any, who: str) -> SampleKey:
    """A clear error for the usual wiring mistake: a plain index where a key was expected."""
    if not isinstance(key, SampleKey):
        raise TypeError(
            f"{who} expects a SampleKey, got {type(key).__name__} {key!r}: build the sampler with "
            f"StatefulSampler(..., yield_keys=True) and pass it as DataLoader(..., sampler=sampler)"
        )
    return key
