"""LeNet-5 (LeCun et al. 1998), with ReLU and max pooling as commonly trained today."""

from __future__ import annotations

import torch
from torch import nn


class LeNet5(nn.Module):
    """conv(6, 5x5) - pool - conv(16, 5x5) - pool - fc 120 - fc 84 - fc ``num_classes``.

    Args:
        in_channels: 1 for MNIST, 3 for CIFAR.
        num_classes: number of logits.
        image_size: 28 (MNIST: the first convolution pads by 2, as the paper's 32x32 input)
            or 32.
    """

    checkpoint_block_types = (nn.Sequential,)

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        if image_size not in (28, 32):
            raise ValueError(f"image_size must be 28 or 32; got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2 if image_size == 28 else 0),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(x))
        return out
