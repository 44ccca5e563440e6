"""Large-batch helpers: gradient accumulation, the linear scaling rule, gradual warm-up.

Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): when the global batch grows by ``k``,
multiply the learning rate by ``k`` (linear scaling rule), and reach that rate by a linear ramp
from the base rate over the first steps (gradual warm-up), because the scaled rate is too large
while the weights still change fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


def linear_scaled_lr(base_lr: float, global_batch_size: int, reference_batch_size: int) -> float:
    """``base_lr * global_batch_size / reference_batch_size`` (Goyal et al. 2017, sec. 2.1).

    ``global_batch_size`` is what one optimizer step sees: per-rank batch x ranks x
    accumulation steps.
    """
    if global_batch_size < 1 or reference_batch_size < 1:
        raise ValueError("batch sizes must be >= 1")
    return base_lr * global_batch_size / reference_batch_size


def warmup_factor(step: int, warmup_steps: int, scale: float) -> float:
    """Multiplier of the base lr at ``step``: ramps linearly from 1 to ``scale``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return scale
    return 1.0 + (scale - 1.0) * step / warmup_steps


def linear_scaling_warmup(
    optimizer: torch.optim.Optimizer, *, scale: float, warmup_steps: int
) -> LambdaLR:
    """Scheduler taking each group's lr (the base lr) to ``scale`` times it over the warm-up.

    Step it once per optimizer step. Example:
        >>> k = global_batch / 256
        >>> sched = linear_scaling_warmup(opt, scale=k, warmup_steps=5 * steps_per_epoch)
    """
    if scale <= 0:
        raise ValueError(f"scale must be > 0; got {scale}")
    return LambdaLR(optimizer, lambda step: warmup_factor(step, warmup_steps, scale))


class GradientAccumulator:
    """Sum the gradients of ``steps`` micro-batches into one optimizer step.

    Under DDP only the last micro-batch communicates (the others run in ``no_sync``), so an
    accumulated step costs one all-reduce. Divide the loss by ``steps`` (``scale_loss``) so the
    result is the gradient of the mean over the whole accumulated batch. Every rank::

        acc = GradientAccumulator(model, steps=4)
        for i, (x, y) in enumerate(loader):
            with acc.micro_step():
                acc.scale_loss(loss_fn(model(x), y)).backward()
            if acc.should_step():
                optimizer.step(); optimizer.zero_grad()
    """

    def __init__(self, model: nn.Module, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"accumulation steps must be >= 1; got {steps}")
        self.model = model
        self.steps = steps
        self._count = 0

    @property
    def is_last(self) -> bool:
        """Whether the micro-batch about to run (or running) completes a step."""
        return (self._count + 1) % self.steps == 0

    @contextlib.contextmanager
    def micro_step(self) -> Iterator[None]:
        sync = self.is_last
        set_sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2
        no_sync = getattr(self.model, "no_sync", None)  # DDP
        if set_sync is not None:
            set_sync(sync)
            yield
        elif no_sync is not None and not sync:
            with no_sync():
                yield
        else:
            yield
        self._count += 1

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss / self.steps if self.steps > 1 else loss

    def should_step(self) -> bool:
        """True right after the micro-batch that completes an accumulated step."""
        return self._count % self.steps == 0
