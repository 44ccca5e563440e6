"""LARS and LAMB, the layer-wise adaptive optimizers for large batches, and an optimizer factory.

Why our own: the well-kept implementation (timm's ``Lars``/``Lamb``) comes with a dependency on
torchvision, a binary tied to one torch build, and torch-optimizer has had no release since
2021 (see docs/adr/0004-communication-strategies.md). Both classes follow the papers' update
rules line by line and are tested against them (``tests/distributed/test_optim.py``).

Parameters with one dimension (biases, normalisation weights) are excluded from the layer-wise
adaptation and weight decay by default, as both papers' reference setups do; then LARS is SGD
with momentum and LAMB is AdamW.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


def _trust_ratio(weight_norm: Tensor, update_norm: Tensor, coefficient: float) -> Tensor:
    """``coefficient * ||w|| / ||u||``, or 1 where either norm is zero."""
    ratio = coefficient * weight_norm / update_norm
    ok = (weight_norm > 0) & (update_norm > 0)
    return torch.where(ok, ratio, torch.ones_like(ratio))


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling (You, Gitman and Ginsburg 2017, Algorithm 1).

    For each parameter tensor ``w`` with gradient ``g``::

        local_lr = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w||)
        v = momentum * v + lr * local_lr * (g + weight_decay * w)
        w = w - v

    Example:
        >>> opt = LARS(model.parameters(), lr=0.1 * global_batch / 256, momentum=0.9)
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.1,
        *,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        exclude_1d: bool = True,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError("lr, momentum, weight_decay must be >= 0; trust_coefficient > 0")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "trust_coefficient": trust_coefficient,
            "exclude_1d": exclude_1d,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                adapt = not (group["exclude_1d"] and p.ndim <= 1)
                decay = group["weight_decay"] if adapt else 0.0
                update = grad.add(p, alpha=decay) if decay else grad.clone()
                if adapt:
                    w_norm = torch.linalg.vector_norm(p)
                    denominator = torch.linalg.vector_norm(grad) + decay * w_norm
                    update.mul_(_trust_ratio(w_norm, denominator, group["trust_coefficient"]))
                update.mul_(group["lr"])
                if group["momentum"]:
                    state = self.state[p]
                    buffer = state.get("momentum_buffer")
                    if buffer is None:
                        buffer = state["momentum_buffer"] = update
                    else:
                        buffer.mul_(group["momentum"]).add_(update)
                    update = buffer
                p.sub_(update)
        return loss


class LAMB(Optimizer):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2020, Algorithm 2).

    For each parameter tensor ``w`` at step ``t`` with gradient ``g``::

        m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
        r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
        u = r + weight_decay * w
        w = w - lr * (||w|| / ||u||) * u        (ratio 1 where a norm is 0)

    Example:
        >>> opt = LAMB(model.parameters(), lr=2e-3, weight_decay=0.01)
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        exclude_1d: bool = True,
    ) -> None:
        if lr < 0 or weight_decay < 0 or eps <= 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("lr, weight_decay must be >= 0; eps > 0; betas in [0, 1)")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "exclude_1d": exclude_1d,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                adapt = not (group["exclude_1d"] and p.ndim <= 1)
                decay = group["weight_decay"] if adapt else 0.0
                if decay:
                    update.add_(p, alpha=decay)
                if adapt:
                    ratio = _trust_ratio(
                        torch.linalg.vector_norm(p), torch.linalg.vector_norm(update), 1.0
                    )
                    update.mul_(ratio)
                p.sub_(update, alpha=group["lr"])
        return loss


def build_optimizer(
    name: str,
    params: ParamsT,
    *,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    **extra: Any,
) -> Optimizer:
    """One of ``sgd``, ``adamw``, ``lars``, ``lamb`` (the spec's ``large_batch.optimizer``).

    ``momentum`` applies to sgd and lars; ``extra`` goes to the optimizer's constructor.
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **extra)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **extra)
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **extra)
    if name == "lamb":
        return LAMB(params, lr=lr, weight_decay=weight_decay, **extra)
    raise ValueError(f"unknown optimizer {name!r}; choose sgd, adamw, lars or lamb")
