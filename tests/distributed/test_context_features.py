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


def _full(state: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: _full(v) for k, v in state.items()}
    if isinstance(state, DTensor):
        return state.full_tensor()
    return state.clone() if isinstance(state, torch.Tensor) else state


def _fsdp_save_then_restore(rank: int, world: int, folder: str) -> dict[str, Any]:
    import trainhub
    from trainhub import models

    os.environ["TRAINHUB_DISTRIBUTED"] = json.dumps({"memory": {"fsdp": True}})

    def make() -> tuple[Any, Any, Any]:
        ctx = trainhub.init(checkpoint_dir=folder)
        model = ctx.prepare_model(models.create("mlp", in_features=6, hidden=(8, 8)))
        optimizer = ctx.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
        return ctx, model, optimizer

    torch.manual_seed(0)
    ctx, model, optimizer = make()
    assert ctx.restore() is None
    gen = torch.Generator().manual_seed(rank)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 6, generator=gen)).pow(2).sum().backward()
        optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 7}
    saved = _full(state)
    ctx.save_checkpoint(state, step=2)  # no code of the script's for sharding
    ctx.close()
    torch.distributed.barrier()  # rank 0 has written the file (a new attempt, in real life)

    torch.manual_seed(1)  # a different initialisation, overwritten by the restore
    ctx, model, optimizer = make()
    restored = ctx.restore()
    assert restored is not None
    model.load_state_dict(restored["model"])
    optimizer.load_state_dict(restored["optimizer"])
    after = _full({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    optimizer.zero_grad()
    model(torch.randn(4, 6, generator=gen)).pow(2).sum().backward()
    optimizer.step()  # and training goes on from there
    ctx.close()
    return {"saved": saved, "after": after, "epoch": restored["epoch"]}


def test_fsdp_checkpoints_are_sharded_and_restore_into_the_sharded_model(tmp_path: Path) -> None:
    results = run_ranks(_fsdp_save_then_restore, str(tmp_path))
    packed = torch.load(tmp_path / "step-2.pt", weights_only=True)
    names = set(packed["trainhub_sharded_checkpoint"])
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= names  # each rank's own shards
    for result in results:
        assert result["epoch"] == 7
        torch.testing.assert_close(result["after"]["model"], result["saved"]["model"])
        torch.testing.assert_close(
            result["after"]["optimizer"]["state"], result["saved"]["optimizer"]["state"]
        )
