"""The teacher and student of the distillation e2e test, and their synthetic data."""

import torch
from torch import nn


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 64, generator=generator)
    projection = torch.randn(64, 4, generator=torch.Generator().manual_seed(99))
    return x, (torch.tanh(x) @ projection).argmax(dim=1)


def teacher() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))


def student() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()
