"""Residual networks: ResNet-20 for CIFAR (He et al. 2016, sec. 4.2) and ResNet-18.

ResNet-20 has three stages of three basic blocks with 16, 32 and 64 channels (0.27M parameters)
and the parameter-free "option A" shortcut (stride-2 subsampling, zero-padded channels).
ResNet-18 is the ImageNet network ([2, 2, 2, 2] basic blocks, 64-512 channels, 11.2M
parameters) with 1x1-convolution shortcuts; ``small_input=True`` swaps its 7x7/stride-2 stem and
max pooling for one 3x3 convolution, the usual variant for 32x32 images.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class PadShortcut(nn.Module):
    """Option A: subsample by ``stride`` and zero-pad the new channels (no parameters)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra = out_channels - in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection."""

    def __init__(
        self, in_channels: int, out_channels: int, stride: int = 1, *, pad_shortcut: bool = False
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            if pad_shortcut:
                self.shortcut = PadShortcut(in_channels, out_channels, stride)
            else:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                    nn.BatchNorm2d(out_channels),
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A stem, stages of :class:`BasicBlock`, global average pooling, a linear classifier."""

    checkpoint_block_types = (BasicBlock,)

    def __init__(
        self,
        blocks_per_stage: list[int],
        widths: list[int],
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        imagenet_stem: bool = False,
        pad_shortcut: bool = False,
    ) -> None:
        super().__init__()
        first = widths[0]
        if imagenet_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, first, 7, 2, 3, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, first, 3, 1, 1, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(),
            )
        layers: list[nn.Module] = []
        channels = first
        for stage, (count, width) in enumerate(zip(blocks_per_stage, widths, strict=True)):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(BasicBlock(channels, width, stride, pad_shortcut=pad_shortcut))
                channels = width
        self.blocks = nn.ModuleList(layers)
        self.head = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return out


def resnet20(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-20 for 32x32 (or 28x28) images: 3 stages x 3 blocks, 16/32/64 channels."""
    return ResNet(
        [3, 3, 3],
        [16, 32, 64],
        num_classes=num_classes,
        in_channels=in_channels,
        pad_shortcut=True,
    )


def resnet18(num_classes: int = 1000, in_channels: int = 3, small_input: bool = False) -> ResNet:
    """ResNet-18; ``small_input`` for 32x32 images (3x3 stem, no max pooling)."""
    return ResNet(
        [2, 2, 2, 2],
        [64, 128, 256, 512],
        num_classes=num_classes,
        in_channels=in_channels,
        imagenet_stem=not small_input,
    )
