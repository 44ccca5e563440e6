"""Post-local SGD: periodic model averaging after a phase of plain gradient all-reduce.

PyTorch ships the pieces (Lin et al. 2020, "Don't use large mini-batches, use local SGD"):
``post_localSGD_hook`` all-reduces gradients until ``start_step`` and then stops communicating
gradients; ``PeriodicModelAverager`` averages the replicas' parameters every ``period`` steps
after ``start_step``; ``PostLocalSGDOptimizer`` runs the averager after each optimizer step. This
module adds only metering (bytes and the time spent averaging count as synchronisation).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import (
    ModelAverager,
    PeriodicModelAverager,
)

from trainhub.runtime.distributed.comm_meter import CommMeter


def check_period(period: int) -> None:
    if period < 2:
        raise ValueError("period must be >= 2 (period 1 is plain DDP at higher cost)")


def is_averaging_step(step: int, warmup_steps: int, period: int) -> bool:
    """Whether the averager averages at ``step`` (as ``PeriodicModelAverager`` decides)."""
    return step >= warmup_steps and (step - warmup_steps) % period == 0


class MeteredPeriodicAverager(PeriodicModelAverager):
    """``PeriodicModelAverager`` that reports what each averaging sends and how long it takes.

    Args:
        period: optimizer steps between two averagings (>= 2).
        warmup_steps: no averaging before this step; equal to the hook's ``start_step``.
        meter: receives the all-reduce payload and the time spent.
        process_group: group to average over; ``None`` is the world.
    """

    def __init__(
        self,
        period: int,
        warmup_steps: int,
        meter: CommMeter,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        check_period(period)
        super().__init__(period=period, warmup_steps=warmup_steps, process_group=process_group)
        self.meter = meter

    def will_average(self) -> bool:
        return is_averaging_step(int(self.step), int(self.warmup_steps), int(self.period))

    def average_parameters(
        self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
    ) -> None:
        if not self.will_average():
            super().average_parameters(params)  # only advances the step counter
            return
        items: list[Any] = list(params)
        payload = sum(t.numel() * t.element_size() for t in _parameters_of(items))
        self.meter.add_allreduce(payload, dist.get_world_size(self.process_group))
        with self.meter.sync():
            super().average_parameters(items)


def _parameters_of(params: list[Any]) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, dict):
            tensors.extend(p for p in item["params"] if p.grad is not None)
        elif item.grad is not None:
            tensors.append(item)
    return tensors


def average_replicas(
    params: Iterable[torch.nn.Parameter], meter: CommMeter, group: dist.ProcessGroup | None
) -> None:
    """Average the parameters over all ranks now (one all-reduce), whatever the period says.

    The average is copied into each parameter's own storage (PyTorch's ``average_parameters``
    rebinds ``p.data`` instead), so a state dict taken before still sees it.
    """
    tensors = list(params)
    if not tensors:
        return
    payload = sum(t.numel() * t.element_size() for t in tensors)
    meter.add_allreduce(payload, dist.get_world_size(group))
    with meter.sync(), torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def wrap_local_sgd_optimizer(
    optimizer: torch.optim.Optimizer, averager: ModelAverager
) -> torch.optim.Optimizer:
    """The optimizer every rank steps: its own step, then (every ``period`` steps) averaging."""
    # imported here, not with the module: torch.distributed.optim pulls in FSDP and DTensor,
    # seconds of every DDP rank's start (benchmarks/first_step.py) that only localsgd needs
    with warnings.catch_warnings():
        # importing torch.distributed.optim scripts its functional optimizers with the
        # deprecated torch.jit.script; nothing we call uses them, and tests turn warnings
        # into errors
        warnings.filterwarnings("ignore", r"`torch.jit.\w+` is deprecated", DeprecationWarning)
        from torch.distributed.optim import PostLocalSGDOptimizer

    wrapped: torch.optim.Optimizer = PostLocalSGDOptimizer(optim=optimizer, averager=averager)
    return wrapped
