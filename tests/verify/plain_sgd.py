"""``torch.optim.SGD``'s update, written out for the training scripts that verify runs in these tests.

A ``torch.optim`` optimizer imports ``torch._dynamo`` when it is built (``add_param_group``) and at its
first step: with torch 2.13 that doubles the CPU a process spends starting (about 2 s of 4), and verify
runs each script three to six times a check, under torchrun once a rank. The scripts' bugs are about
what a resume restores, not about the optimizer: this one has a state to save and to forget, as SGD's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class PlainSGD:
    """SGD with optional momentum: ``step`` after ``backward``; ``state_dict`` holds the momentum buffers."""

    def __init__(self, parameters: Iterable[torch.Tensor], lr: float, momentum: float = 0.0) -> None:
        self.parameters, self.lr, self.momentum = list(parameters), lr, momentum
        self.buffers = [torch.zeros_like(parameter) for parameter in self.parameters]

    def zero_grad(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for parameter, buffer in zip(self.parameters, self.buffers):
            buffer.mul_(self.momentum).add_(parameter.grad)
            parameter.sub_(self.lr * buffer)

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {"momentum_buffers": [buffer.clone() for buffer in self.buffers]}

    def load_state_dict(self, state: dict[str, list[torch.Tensor]]) -> None:
        for buffer, saved in zip(self.buffers, state["momentum_buffers"]):
            buffer.copy_(saved)
