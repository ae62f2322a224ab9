"""A batch's fingerprint: a hash of every tensor and value in it, in structure order.

Two batches with the same records in another order, or the same records with other augmentation,
hash differently; so comparing fingerprints checks both without the dataset returning indices.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from stateful_sampler.keys import SampleKey


def batch_fingerprint(batch: Any) -> str:
    """A hex digest of the batch: dtypes, shapes and bytes of its tensors, and its other values."""
    digest = hashlib.blake2b(digest_size=16)
    _feed(digest, batch)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"mapping {len(value)};".encode())
        for key in sorted(value, key=repr):
            digest.update(f"key {key!r};".encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"value {value!r};".encode())


def batch_rows(batch: Any) -> list[str] | None:
    """A hex digest of each record of a collated batch (row ``i`` of every tensor in it, in structure
    order), which names a record when the batch carries no ``SampleKey``; ``None`` when the batch's
    tensors do not share their first dimension.

    Example:
        >>> rows = batch_rows((torch.tensor([[1.0], [2.0], [1.0]]), torch.tensor([0, 1, 0])))
        >>> rows[0] == rows[2] != rows[1]
        True
    """
    tensors: list[torch.Tensor] = []
    _tensors(batch, tensors)
    if not tensors or any(tensor.dim() == 0 or len(tensor) != len(tensors[0]) for tensor in tensors):
        return None
    rows = []
    for row in range(len(tensors[0])):
        digest = hashlib.blake2b(digest_size=8)
        for tensor in tensors:
            _feed(digest, tensor[row])
        rows.append(digest.hexdigest())
    return rows


def _tensors(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            _tensors(value[key], found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, found)


def batch_indices(batch: Any) -> list[int] | None:
    """The dataset indices of a batch when it carries them as a collated ``SampleKey``
    (``StatefulSampler(yield_keys=True)`` with ``KeyedDataset``); ``None`` otherwise."""
    if isinstance(batch, SampleKey) and isinstance(batch.index, torch.Tensor):
        return batch.index.tolist()
    if isinstance(batch, Mapping):
        children: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        children = batch
    else:
        return None
    for child in children:
        found = batch_indices(child)
        if found is not None:
            return found
    return None


def rng_fingerprints() -> dict[str, str]:
    """A hex digest of each of the process's RNG states, by name: ``torch`` (CPU), ``cuda`` (once
    initialised), ``numpy`` (the legacy global RNG) and ``random``; what a model's dropout draws from next.
    Kept apart, so an RNG a script never seeds (NumPy's, Python's) does not hide the one it does."""
    digests = {"torch": _digest(torch.get_rng_state().numpy().tobytes())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        digests["cuda"] = _digest(b"".join(state.numpy().tobytes() for state in torch.cuda.get_rng_state_all()))
    kind, key, position, has_gauss, gauss = np.random.get_state(legacy=True)
    digests["numpy"] = _digest(
        f"{kind} {position} {has_gauss} {gauss!r};".encode() + np.ascontiguousarray(key).tobytes()
    )
    digests["random"] = _digest(repr(random.getstate()).encode())
    return digests


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()
