"""Weights and ids as users hold them: tensors of any float dtype, requiring grad or on another device, give
their values; ids that do not fit are refused naming the value they really are."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from stateful_sampler import StatefulSampler
from stateful_sampler.order.mixture import Mixture
from stateful_sampler.order.strategy import id_array, weight_array
from stateful_sampler.order.stratified import Stratified
from stateful_sampler.order.weighted import Weighted


class DeviceTensor:
    """What a CUDA tensor offers without a GPU here: NumPy refuses it, ``.detach().cpu()`` gives its values."""

    def __init__(self, values: torch.Tensor, device: str = "cuda:0") -> None:
        self.values, self.device, self.dtype = values, device, values.dtype

    def __len__(self) -> int:
        return len(self.values)

    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() first.")

    def detach(self) -> DeviceTensor:
        return self

    def cpu(self) -> torch.Tensor:
        return self.values


WEIGHTS = [0.5, 2.0, 1.0, 0.25]


@pytest.mark.parametrize(
    "weights",
    [
        torch.tensor(WEIGHTS, dtype=torch.bfloat16),
        torch.tensor(WEIGHTS, dtype=torch.float16),
        torch.tensor(WEIGHTS, requires_grad=True),
        torch.tensor(WEIGHTS, dtype=torch.bfloat16, requires_grad=True) * 1,  # a non-leaf with a grad_fn
        DeviceTensor(torch.tensor(WEIGHTS, dtype=torch.bfloat16)),
        torch.tensor(WEIGHTS, dtype=torch.float64).to_sparse().to_dense(),
    ],
    ids=["bf16", "fp16", "requires_grad", "bf16-grad_fn", "cuda-like", "fp64"],
)
def test_weight_tensors_of_any_dtype_and_device_give_the_same_order(weights):
    expected = StatefulSampler(4, strategy=Weighted(WEIGHTS), seed=2)
    sampler = StatefulSampler(4, strategy=Weighted(weights), seed=2)
    assert np.array_equal(weight_array("weights", weights), np.array(WEIGHTS))
    assert list(sampler) == list(expected)
    assert sampler.state_dict() == expected.state_dict()  # the same fingerprint: the same order
    mixture = Mixture([3, 1, 2, 2], weights, num_samples=8)
    assert np.array_equal(mixture.weights_at(0), Mixture([3, 1, 2, 2], WEIGHTS, num_samples=8).weights_at(0))
    assert np.array_equal(Weighted(weights, replacement=False).weights, np.array(WEIGHTS))


def test_labels_as_tensors_of_any_dtype_and_device_give_the_same_order():
    labels = [0, 2, 1, 2, 0, 1]
    expected = list(StatefulSampler(6, strategy=Stratified(labels), seed=1))
    for tensor in (torch.tensor(labels, dtype=torch.bfloat16, requires_grad=True), DeviceTensor(torch.tensor(labels))):
        assert list(StatefulSampler(6, strategy=Stratified(tensor), seed=1)) == expected


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (  # the repro: the error said -9223372036854775808
            lambda: Stratified([0, 1e20, 1]),
            ValueError,
            "labels must hold integer ids of at most 2**63 - 1, got 1e+20 at position 1",
        ),
        (
            lambda: Stratified(np.array([0, 2**64 - 1], dtype=np.uint64)),
            ValueError,
            "labels must hold integer ids of at most 2**63 - 1, got 18446744073709551615 at position 1",
        ),
        (
            lambda: Stratified([0, 2**64]),
            ValueError,
            "labels must hold integer ids of at most 2**63 - 1, got 18446744073709551616 at position 1",
        ),
        (
            lambda: Stratified([3, -1, 2**63]),  # NumPy makes floats of these: each value is kept exact
            ValueError,
            "labels must hold integer ids of at most 2**63 - 1, got 9223372036854775808 at position 2",
        ),
        (
            lambda: Stratified([0, -1e30]),
            ValueError,
            "labels must hold integer ids within int64, got -1e+30 at position 1",
        ),
        (lambda: Stratified([0, -2.0]), ValueError, "labels must hold non-negative ids, got -2 at position 1"),
        (
            lambda: Stratified([0, 0.5]),
            TypeError,
            "labels must hold integer ids, got dtype float64 with 0.5 at position 1",
        ),
        (lambda: Stratified([0, "a", 1.5]), TypeError, "labels must hold integer ids, got dtype <U32"),
        (lambda: Stratified([0, None]), TypeError, "labels must hold integer ids, got NoneType None at position 1"),
        (
            lambda: Mixture([2**62, 2**62], [1, 1], num_samples=4),
            ValueError,
            "sizes must add up to fewer than 2**62 records (a dataset's N), got 9223372036854775808",
        ),
        (
            lambda: Weighted(torch.ones(3, device="meta")),
            TypeError,
            (
                "weights must be a list, a NumPy array or a 1-D tensor with readable values, got a tensor of "
                "torch.float32 on meta: "
            ),
        ),
        (
            lambda: Weighted(torch.ones(3, dtype=torch.complex64)),
            TypeError,
            "weights must hold numbers, got dtype complex64",
        ),
        (lambda: Weighted([1, 10**400]), ValueError, f"weights must be finite, got {10**400} at position 1"),
        (lambda: Weighted([1, None]), TypeError, "weights must hold numbers, got NoneType None at position 1"),
        (
            lambda: Weighted(torch.tensor([1.0, -2.0], dtype=torch.bfloat16, requires_grad=True)),
            ValueError,
            "weights must be finite and non-negative, got -2.0 at position 1",
        ),
    ],
)
def test_bad_weights_and_ids_are_refused_naming_the_argument_and_the_value(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_huge_weights_keep_their_ratios():
    assert np.array_equal(Mixture([2, 3], [1e308, 1e308], num_samples=4).weights_at(0), [0.5, 0.5])
    assert list(StatefulSampler(2, strategy=Weighted([1e308, 1e308]), seed=4)) == list(
        StatefulSampler(2, strategy=Weighted([1, 1]), seed=4)
    )
    assert id_array("ids", [2**63 - 1, 0]).tolist() == [2**63 - 1, 0]
