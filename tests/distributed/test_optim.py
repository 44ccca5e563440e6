"""LARS and LAMB against their papers' update rules, written out step by step here."""

from __future__ import annotations

import pytest
import torch

from trainhub.runtime.distributed.optim import LAMB, LARS, build_optimizer


def _problem() -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    w = torch.randn(5, 4)
    grads = [torch.randn(5, 4) for _ in range(4)]
    return w, grads


def _run(
    optimizer_cls: type, w0: torch.Tensor, grads: list[torch.Tensor], **kw: object
) -> torch.Tensor:
    w = torch.nn.Parameter(w0.clone())
    opt = optimizer_cls([w], **kw)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    return w.detach()


def test_lars_follows_algorithm_1() -> None:
    w0, grads = _problem()
    lr, momentum, decay, eta = 0.5, 0.9, 1e-3, 0.01
    w, v = w0.clone(), torch.zeros_like(w0)
    for g in grads:  # You, Gitman, Ginsburg 2017, Algorithm 1
        local_lr = eta * w.norm() / (g.norm() + decay * w.norm())
        v = momentum * v + lr * local_lr * (g + decay * w)
        w = w - v
    got = _run(LARS, w0, grads, lr=lr, momentum=momentum, weight_decay=decay, trust_coefficient=eta)
    torch.testing.assert_close(got, w)


def test_lamb_follows_algorithm_2() -> None:
    w0, grads = _problem()
    lr, (b1, b2), eps, decay = 0.01, (0.9, 0.999), 1e-6, 0.01
    w, m, v = w0.clone(), torch.zeros_like(w0), torch.zeros_like(w0)
    for t, g in enumerate(grads, start=1):  # You et al. 2020, Algorithm 2
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        u = r + decay * w
        w = w - lr * (w.norm() / u.norm()) * u
    got = _run(LAMB, w0, grads, lr=lr, betas=(b1, b2), eps=eps, weight_decay=decay)
    torch.testing.assert_close(got, w)


def test_excluded_vectors_fall_back_to_sgd_and_adam() -> None:
    torch.manual_seed(1)
    b0 = torch.randn(6)
    grads = [torch.randn(6) for _ in range(3)]
    lars = _run(LARS, b0, grads, lr=0.1, momentum=0.9, weight_decay=0.1)
    sgd = _run(torch.optim.SGD, b0, grads, lr=0.1, momentum=0.9)  # no decay on vectors
    torch.testing.assert_close(lars, sgd)
    lamb = _run(LAMB, b0, grads, lr=0.01, weight_decay=0.1)
    adam = _run(torch.optim.Adam, b0, grads, lr=0.01, eps=1e-6)
    torch.testing.assert_close(lamb, adam)


def test_zero_weights_use_a_trust_ratio_of_one() -> None:
    w = torch.nn.Parameter(torch.zeros(3, 3))
    w.grad = torch.ones(3, 3)
    LARS([w], lr=0.1, momentum=0.0).step()
    torch.testing.assert_close(w.detach(), torch.full((3, 3), -0.1))


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars", "lamb"])
def test_build_optimizer(name: str) -> None:
    w = torch.nn.Parameter(torch.ones(2, 2))
    assert build_optimizer(name, [w], lr=0.1).param_groups[0]["lr"] == 0.1
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("adagrad", [w], lr=0.1)
