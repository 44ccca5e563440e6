"""What the spec promises, through ``trainhub.init()`` on two real gloo ranks (standalone mode)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.distributed.launch import run_ranks


def _local_sgd_checkpoint(rank: int, world: int, folder: str) -> dict[str, Any]:
    import trainhub
    from trainhub.runtime import unwrap_model

    section = {"strategy": "localsgd", "localsgd": {"period": 1000, "start_step": 0}}
    os.environ["TRAINHUB_DISTRIBUTED"] = json.dumps(section)
    with trainhub.init(checkpoint_dir=folder) as ctx:
        torch.manual_seed(0)
        model = ctx.prepare_model(nn.Linear(3, 2))
        optimizer = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
        gen = torch.Generator().manual_seed(rank)  # each rank its own data: replicas drift
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 3, generator=gen)).pow(2).sum().backward()
            ctx.step(optimizer)
        replica = {k: v.clone() for k, v in unwrap_model(model).state_dict().items()}
        ctx.save_checkpoint({"model": unwrap_model(model).state_dict()}, step=3)
    return {"replica": replica}


def test_local_sgd_saves_the_average_of_the_replicas(tmp_path: Path) -> None:
    results = run_ranks(_local_sgd_checkpoint, str(tmp_path))
    saved = torch.load(tmp_path / "step-3.pt", weights_only=True)["model"]
    first, second = results[0]["replica"], results[1]["replica"]
    assert not torch.allclose(first["weight"], second["weight"])  # they did drift apart
    for key, value in saved.items():
        torch.testing.assert_close(value, (first[key] + second[key]) / 2)
