"""Synthetic classification data of any size, generated on access (no memory per sample).

Sample ``i`` has label ``i % num_classes`` and input ``prototype[label] + noise * z_i``, where
the prototypes and ``z_i`` come from generators seeded by ``seed`` (and ``i``): the same index
always yields the same sample, on every rank and in every worker process, so the data can be
sharded like a real dataset. Prototype and noise entries are standard normal; raise ``noise``
to make the task harder.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from trainhub.data.splits import Splits


class SyntheticClassification(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``num_samples`` deterministic samples of shape ``input_shape``."""

    def __init__(
        self,
        num_samples: int,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_classes: int = 10,
        *,
        noise: float = 1.0,
        seed: int = 0,
        offset: int = 0,
    ) -> None:
        if num_samples < 1 or num_classes < 2:
            raise ValueError("need num_samples >= 1 and num_classes >= 2")
        self.num_samples = num_samples
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.noise = noise
        self.seed = seed
        self.offset = offset  # index offset, so train and val draw different samples
        generator = torch.Generator().manual_seed(seed)
        size = math.prod(self.input_shape)
        self.prototypes = torch.randn(num_classes, size, generator=generator)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        absolute = self.offset + index
        label = absolute % self.num_classes
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + absolute + 1)
        z = torch.randn(self.prototypes.shape[1], generator=generator)
        x = self.prototypes[label] + self.noise * z
        return x.view(self.input_shape), torch.tensor(label)


def load_synthetic(
    *,
    num_train: int = 10_000,
    num_val: int = 2_000,
    input_shape: tuple[int, ...] = (1, 28, 28),
    num_classes: int = 10,
    noise: float = 1.0,
    seed: int = 0,
) -> Splits:
    """Train and val sets drawn from the same distribution, without overlapping samples."""
    common = {"input_shape": input_shape, "num_classes": num_classes, "noise": noise, "seed": seed}
    return Splits(
        SyntheticClassification(num_train, **common),  # type: ignore[arg-type]
        SyntheticClassification(num_val, offset=num_train, **common),  # type: ignore[arg-type]
        num_classes=num_classes,
        input_shape=tuple(input_shape),
        description=f"synthetic, {num_train} train / {num_val} val, seed {seed}",
    )
