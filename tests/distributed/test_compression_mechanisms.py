"""The mechanisms compression's accuracy rests on: error feedback loses nothing over steps, and
fp16 on the wire neither overflows nor flushes small gradients to zero."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from tests.distributed.launch import run_ranks
from trainhub.runtime.distributed.fp16 import ScaledFP16State, scaled_fp16_hook, wire_scale
from trainhub.runtime.distributed.onebit import compress, decompress
from trainhub.runtime.distributed.topk import select_topk


def test_error_feedback_delays_what_it_drops_but_loses_none_of_the_gradient_sum() -> None:
    """sum of what was sent over T steps + the residual left == sum of the T gradients."""
    torch.manual_seed(0)
    lengths = [300, 50, 650]
    n = sum(lengths)
    for name in ("onebit", "topk"):
        residual = torch.zeros(n)
        sent_sum, grad_sum = (
            torch.zeros(n, dtype=torch.float64),
            torch.zeros(n, dtype=torch.float64),
        )
        for _ in range(50):
            grad = torch.randn(n) * torch.rand(n)
            x = grad + residual
            if name == "onebit":
                message, residual = compress(x, lengths)
                sent = decompress(message, lengths)
            else:
                indices, values = select_topk(x, 10)
                sent = torch.zeros(n).index_put_((indices.long(),), values)
                residual = x.index_fill(0, indices.long(), 0.0)
            sent_sum += sent.double()
            grad_sum += grad.double()
        torch.testing.assert_close(sent_sum + residual.double(), grad_sum, rtol=0, atol=1e-4)
        # and the residual stays bounded (the compressor is a contraction): nothing piles up
        assert residual.abs().max() < 50


def test_the_wire_scale_keeps_the_sum_in_fp16_range() -> None:
    assert wire_scale(1e5, 2) * 2 * 1e5 <= 2**15
    assert wire_scale(1e-6, 8) * 8 * 1e-6 > 2**14  # small gradients are lifted, not flushed
    assert wire_scale(float("inf"), 2) == 1.0
    assert wire_scale(0.0, 2) == 1.0


class _Bucket:
    """What a DDP comm hook reads from its bucket."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def is_last(self) -> bool:
        return True


def _fp16_hooks(rank: int, world: int) -> dict[str, Any]:
    buckets = {
        # gradients as fp16 autocast's GradScaler hands them to DDP (x 65536 at first)
        "large": torch.tensor([1.5e5 * (rank + 1), -7e4, 3.0, -1.0, 0.0]),
        # late in training: every entry below fp16's smallest normal number (6e-5)
        "small": torch.tensor([3e-8 * (rank + 1), 2e-6, -5e-7, 1e-8, 0.0]),
    }
    out: dict[str, Any] = {}
    for name, grads in buckets.items():
        ours = _Bucket(grads.clone())
        scaled_fp16_hook(ScaledFP16State(), ours).wait()  # type: ignore[arg-type]
        theirs = _Bucket(grads.clone())
        default_hooks.fp16_compress_hook(None, theirs).wait()  # type: ignore[arg-type]
        out[name] = {"ours": ours.buffer(), "torch": theirs.buffer()}
    return out


def test_the_fp16_hook_neither_overflows_nor_underflows() -> None:
    results = run_ranks(_fp16_hooks)
    large = torch.tensor([2.25e5, -7e4, 3.0, -1.0, 0.0])
    small = torch.tensor([4.5e-8, 2e-6, -5e-7, 1e-8, 0.0])
    for result in results:
        assert torch.isinf(result["large"]["torch"][:2]).all()  # PyTorch's hook: inf > 65504
        assert result["small"]["torch"][0] == 0.0  # ... and 0 for 4.5e-8 (flushed)
        # ours: the mean within fp16's relative precision of the bucket's largest entry
        torch.testing.assert_close(result["large"]["ours"], large, rtol=0, atol=2.25e5 * 2**-10)
        torch.testing.assert_close(result["small"]["ours"], small, rtol=2**-10, atol=2e-6 * 2**-10)


def _momentum_corrected_vs_sgd(rank: int, world: int, strategy: str) -> dict[str, Any]:
    from torch import nn

    from trainhub.runtime.distributed import DistributedConfig, apply_strategy

    sections = {
        # dense throughout (start_step beyond the run): only the momentum moved into the hook
        "topk": {"strategy": "topk", "topk": {"start_step": 100, "momentum_correction": True}},
        "onebit": {"strategy": "onebit", "onebit": {"start_step": 100}},
        "allreduce": {"strategy": "allreduce"},
    }
    torch.manual_seed(0)
    prepared = apply_strategy(
        nn.Linear(8, 4), DistributedConfig.from_mapping(sections[strategy]), device="cpu"
    )
    optimizer = prepared.make_optimizer(lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        optimizer.zero_grad()
        prepared.model(torch.randn(4, 8, generator=gen)).pow(2).sum().backward()
        optimizer.step()
    return {
        "weight": prepared.module.weight.detach().clone(),
        "optimizer_momentum": optimizer.param_groups[0]["momentum"],
        "hook_momentum": getattr(prepared.hook_state, "momentum", None),
    }


def _all_three(rank: int, world: int) -> dict[str, Any]:
    return {s: _momentum_corrected_vs_sgd(rank, world, s) for s in ("allreduce", "topk", "onebit")}


def test_momentum_correction_is_exactly_momentum_sgd_while_nothing_is_dropped() -> None:
    results = run_ranks(_all_three)
    for result in results:
        reference = result["allreduce"]["weight"]
        for strategy in ("topk", "onebit"):
            assert result[strategy]["hook_momentum"] == 0.9
            assert result[strategy]["optimizer_momentum"] == 0.0
            torch.testing.assert_close(result[strategy]["weight"], reference)
