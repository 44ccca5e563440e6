"""Large-batch helpers: gradient accumulation, the linear scaling rule, gradual warm-up.

Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): when the global batch grows by ``k``,
multiply the learning rate by ``k`` (linear scaling rule), and reach that rate by a linear ramp
from the base rate over the first steps (gradual warm-up), because the scaled rate is too large
while the weights still change fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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


def convert_optimizer(optimizer: torch.optim.Optimizer, kind: str) -> torch.optim.Optimizer:
    """The same parameter groups under ``kind`` (``lars`` or ``lamb``); others: ``optimizer``.

    Hyperparameters carry over by name (``lr``, ``weight_decay``; ``momentum`` for LARS,
    ``betas``/``eps`` for LAMB); the rest of each group keeps the new optimizer's defaults.
    """
    from trainhub.runtime.distributed.optim import LAMB, LARS

    target: type[torch.optim.Optimizer]
    keys: tuple[str, ...]
    if kind == "lars":
        target, keys = LARS, ("lr", "momentum", "weight_decay")
    elif kind == "lamb":
        target, keys = LAMB, ("lr", "betas", "eps", "weight_decay")
    else:
        return optimizer
    if isinstance(optimizer, target):
        return optimizer
    groups = [
        {"params": group["params"], **{k: group[k] for k in keys if k in group}}
        for group in optimizer.param_groups
    ]
    return target(groups)


class LargeBatchSchedule:
    """Linear lr scaling and gradual warm-up applied around every step of an optimizer.

    The scaled rate is written into the groups once (so a scheduler the user builds
    afterwards starts from it); during the warm-up a step pre-hook lowers each group's rate to
    the ramp's value for that step and a post-hook puts it back, so the user's own scheduler
    keeps control of the rate outside the step.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, scale: float, warmup_steps: int):
        self.optimizer = optimizer
        self.scale = scale
        self.warmup_steps = warmup_steps
        self.steps = 0
        self._saved: list[float] = []
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * scale
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * scale
        if warmup_steps > 0 and scale != 1.0:
            optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    def factor(self) -> float:
        """What the scaled rate is multiplied by at the current step (1 after the warm-up)."""
        return warmup_factor(self.steps, self.warmup_steps, self.scale) / self.scale

    def _before_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        factor = self.factor()
        self._saved = [group["lr"] for group in optimizer.param_groups]
        if factor != 1.0:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self._saved:
            for group, lr in zip(optimizer.param_groups, self._saved, strict=True):
                group["lr"] = lr
            self._saved = []
        self.steps += 1


def apply_large_batch(
    optimizer: torch.optim.Optimizer,
    *,
    optimizer_kind: str,
    lr_scaling: str,
    reference_batch_size: int,
    warmup_steps: int,
    global_batch_size: int | None,
) -> torch.optim.Optimizer:
    """The spec's ``large_batch`` applied to a user's optimizer (see ``Context.prepare_optimizer``).

    ``lars``/``lamb`` replace the optimizer (same groups); ``lr_scaling: linear`` multiplies
    every group's rate by ``global_batch_size / reference_batch_size`` and, with
    ``warmup_steps``, ramps it there from the base rate.

    Raises:
        ValueError: linear scaling without a known global batch size.
    """
    optimizer = convert_optimizer(optimizer, optimizer_kind)
    if lr_scaling != "linear":
        return optimizer
    if global_batch_size is None:
        raise ValueError(
            "distributed.large_batch.lr_scaling is 'linear' but the global batch size is "
            "unknown: build the loader with ctx.prepare_data_loader(...) first, or pass "
            "ctx.prepare_optimizer(optimizer, per_rank_batch_size=...)"
        )
    scale = linear_scaled_lr(1.0, global_batch_size, reference_batch_size)
    LargeBatchSchedule(optimizer, scale=scale, warmup_steps=warmup_steps)
    return optimizer
