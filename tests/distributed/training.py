"""A complete small training run through the public API, used by the multi-rank tests.

It is the loop of docs/distributed.md: apply_strategy, the strategy's optimizer, precision,
gradient accumulation, the linear-scaling schedule and the step timer.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainhub import data, models
from trainhub.data.loader import make_loader, set_epoch
from trainhub.runtime.distributed import DistributedConfig, StepTimer, apply_strategy


def evaluate(model: nn.Module, dataset: Any) -> float:
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return float(accuracy)


def train_digits(
    rank: int,
    world: int,
    section: dict[str, Any],
    *,
    epochs: int = 6,
    batch_size: int = 32,
    lr: float = 0.05,
    model_name: str = "mlp",
) -> dict[str, Any]:
    """Train on sklearn digits with the ``distributed`` section ``section``; every rank."""
    torch.manual_seed(0)
    splits = data.load("digits")
    config = DistributedConfig.from_mapping(section)
    kwargs: dict[str, Any] = {"in_features": 64, "hidden": (64,)} if model_name == "mlp" else {}
    prepared = apply_strategy(models.create(model_name, **kwargs), config, device="cpu")
    model = prepared.model
    optimizer = prepared.make_optimizer(lr=lr, momentum=0.9)
    scheduler = prepared.make_lr_scheduler(optimizer, per_rank_batch_size=batch_size)
    accumulator = prepared.make_accumulator()
    precision = prepared.precision
    loader = make_loader(splits.train, batch_size, seed=1)
    timer = StepTimer(meter=prepared.meter)
    summaries = []
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        for x, y in timer.iter_data(loader):
            with accumulator.micro_step():
                with timer.phase("forward"), precision.autocast():
                    loss = nn.functional.cross_entropy(model(x), y)
                with timer.phase("backward"):
                    precision.backward(accumulator.scale_loss(loss))
            if accumulator.should_step():
                with timer.phase("optimizer"):
                    precision.step(optimizer)
                    optimizer.zero_grad()
                    scheduler.step()
            timer.end_step(len(x))
        summaries.append(timer.summary())
    prepared.average_replicas()  # local SGD: the trial's model is the replicas' average
    # full-tensor weights for evaluation (FSDP shards them)
    eval_model = prepared.module
    if config.memory.fsdp:
        from torch.distributed.tensor import DTensor

        full = {
            k: v.full_tensor() if isinstance(v, DTensor) else v
            for k, v in eval_model.state_dict().items()
        }
        eval_model = models.create(model_name, **kwargs)
        eval_model.load_state_dict(full)
    accuracy = evaluate(eval_model, splits.val)
    flat = torch.cat([p.detach().flatten() for p in eval_model.parameters()])
    spread = 0.0
    if dist.is_initialized():
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        spread = float((high - low).abs().max())
    prepared.close()  # ps: every rank is done with the shards
    return {
        "accuracy": accuracy,
        "summaries": summaries,
        "replica_spread": spread,
        "lr": optimizer.param_groups[0]["lr"],
        "hook_state": type(prepared.hook_state).__name__,
        "ray_imported": "ray" in sys.modules,
    }
