"""Linear scaling with gradual warm-up, and gradient accumulation (single process)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainhub.runtime.distributed.large_batch import (
    GradientAccumulator,
    linear_scaled_lr,
    linear_scaling_warmup,
    warmup_factor,
)


def test_linear_scaling_rule() -> None:
    assert linear_scaled_lr(0.1, 8192, 256) == pytest.approx(3.2)  # Goyal et al.: 0.1 x 32
    with pytest.raises(ValueError, match=">= 1"):
        linear_scaled_lr(0.1, 0, 256)


def test_warmup_ramps_linearly_from_base_to_scaled() -> None:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = linear_scaling_warmup(opt, scale=4.0, warmup_steps=3)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4])
    assert warmup_factor(0, 0, 2.0) == 2.0


def test_accumulated_gradient_is_the_gradient_of_the_whole_batch() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    x, y = torch.randn(12, 4), torch.randn(12, 2)
    acc = GradientAccumulator(model, steps=3)
    steps = []
    for chunk_x, chunk_y in zip(x.split(4), y.split(4), strict=True):
        with acc.micro_step():
            acc.scale_loss(nn.functional.mse_loss(model(chunk_x), chunk_y)).backward()
        steps.append(acc.should_step())
    assert steps == [False, False, True]
    nn.functional.mse_loss(reference(x), y).backward()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
