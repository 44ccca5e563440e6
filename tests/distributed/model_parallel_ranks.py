"""Rank functions of the model-parallel tests (importable by forked ranks; tiny model)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS, BATCH, LR = 5, 8, 0.05
MODEL = {"input_dim": 6, "max_length": 4, "dim": 16, "depth": 4, "num_heads": 2}


def make_model() -> nn.Module:
    from trainhub import models

    torch.manual_seed(0)
    return models.create("transformer", num_classes=3, **MODEL)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, MODEL["max_length"], MODEL["input_dim"], generator=gen)
    return x, torch.randint(0, 3, (BATCH,), generator=gen)


def reference_losses(steps: int = STEPS) -> list[float]:
    """One process, the whole model and batch: the losses every layout must reproduce."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def train(rank: int, world: int, section: dict[str, Any], steps: int = STEPS) -> dict[str, Any]:
    """``steps`` steps of the tiny transformer under ``section``; this rank's losses. Each
    data-parallel replica trains on its share of the batch (the single process's batch)."""
    from trainhub.distributed_contract import DistributedSpec
    from trainhub.runtime.distributed.parallel import parallelize

    config = DistributedSpec.from_mapping(section)
    par = parallelize(make_model(), config, device="cpu", loss_fn=nn.functional.cross_entropy)
    optimizer = torch.optim.SGD(par.parameters(), lr=LR, momentum=0.9)
    shard, shards = par.data_rank()
    losses = []
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        losses.append(float(par.step(x[shard::shards], y[shard::shards])))
        optimizer.step()
    return {"losses": losses, "times": par.time_summary(), "layout": par.layout.describe()}


def train_layouts(rank: int, world: int, sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`train` under each section in turn, in the same ranks (one launch)."""
    return [train(rank, world, section) for section in sections]


def refused(rank: int, world: int, section: dict[str, Any], points: list[str] | None) -> str:
    """The SpecRefused message ``parallelize`` raises, or '' when it raised none."""
    from trainhub.distributed_contract import DistributedSpec
    from trainhub.runtime.distributed.parallel import parallelize
    from trainhub.runtime.errors import SpecRefused

    try:
        parallelize(
            make_model(),
            DistributedSpec.from_mapping(section),
            device="cpu",
            loss_fn=nn.functional.cross_entropy,
            split_points=points,
        )
    except SpecRefused as exc:
        return str(exc)
    return ""


def save_then_restore(
    rank: int, world: int, first: dict[str, Any], second: dict[str, Any], folder: str
) -> dict[str, Any]:
    """3 steps under ``first``, a checkpoint through ``ctx.save_checkpoint``; then a new
    context restores it under ``second`` and trains to step 5."""
    import trainhub

    def run(section: dict[str, Any], start_fresh: bool) -> dict[str, Any]:
        os.environ["TRAINHUB_DISTRIBUTED"] = json.dumps(section)
        ctx = trainhub.init(checkpoint_dir=folder)
        par = ctx.parallelize(make_model(), loss_fn=nn.functional.cross_entropy)
        optimizer = ctx.prepare_optimizer(torch.optim.SGD(par.parameters(), lr=LR, momentum=0.9))
        state = ctx.restore()
        assert (state is None) == start_fresh
        begin = 0 if state is None else int(state["step"]) + 1
        losses = {}
        for step in range(begin, STEPS if not start_fresh else 3):
            x, y = batch(step)
            optimizer.zero_grad()
            losses[step] = float(par.step(x, y))
            optimizer.step()
            if start_fresh and step == 2:
                ctx.save_checkpoint({**par.state_dict(optimizer), "step": step}, step=step)
        ctx.close()
        return losses

    before = run(first, True)
    torch.distributed.barrier()
    after = run(second, False)
    return {"before": before, "after": after, "files": sorted(os.listdir(Path(folder)))}
