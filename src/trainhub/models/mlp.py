"""A multi-layer perceptron over flattened inputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn


class MLPBlock(nn.Module):
    """Linear -> ReLU (-> dropout)."""

    def __init__(self, in_features: int, out_features: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(torch.relu(self.linear(x)))
        return out


class MLP(nn.Module):
    """Flatten, ``len(hidden)`` ReLU layers, a linear classifier.

    Args:
        in_features: size of one flattened input (784 for 28x28 MNIST, 64 for digits).
        hidden: width of each hidden layer; ``(4096, 2048)`` on 784 inputs is about 11.6M
            parameters, a communication-bound model for benchmarks.
        num_classes: number of logits.
        dropout: dropout after each hidden layer.
    """

    checkpoint_block_types = (MLPBlock,)

    def __init__(
        self,
        in_features: int = 784,
        hidden: Sequence[int] = (256, 128),
        num_classes: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        widths = [in_features, *hidden]
        self.blocks = nn.ModuleList(MLPBlock(a, b, dropout) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def hidden_for_parameters(in_features: int, num_classes: int, target: int, depth: int = 2) -> int:
    """A width ``w`` for ``depth`` equal hidden layers giving at least ``target`` parameters."""
    # in*w + (depth-1)*w^2 + w*classes (+ biases) >= target
    a, b = depth - 1, in_features + num_classes + depth
    if a == 0:
        return math.ceil(target / b)
    return math.ceil((-b + math.sqrt(b * b + 4 * a * target)) / (2 * a))
