"""A sharded checkpoint as one file per rank (ADR 0040), on two real gloo ranks: each rank
writes its own shards; a restore reads the index, the shared state and its own file only."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.distributed.launch import run_ranks


def _full(state: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: _full(v) for k, v in state.items()}
    if isinstance(state, DTensor):
        return state.full_tensor()
    return state.clone() if isinstance(state, torch.Tensor) else state


def _save_then_restore_own_files(rank: int, world: int, folder: str) -> dict[str, Any]:
    import trainhub
    from trainhub import models
    from trainhub.runtime.distributed.sharded_checkpoint import (
        METADATA,
        SHARED,
        needed_files,
        read_shards,
        write_shards,
    )

    os.environ["TRAINHUB_DISTRIBUTED"] = json.dumps({"memory": {"fsdp": True}})

    def make() -> tuple[Any, Any, Any]:
        ctx = trainhub.init(checkpoint_dir=folder)
        model = ctx.prepare_model(models.create("mlp", in_features=6, hidden=(8, 8)))
        optimizer = ctx.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
        return ctx, model, optimizer

    torch.manual_seed(0)
    ctx, model, optimizer = make()
    gen = torch.Generator().manual_seed(rank)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 6, generator=gen)).pow(2).sum().backward()
        optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 7}
    saved = _full(state)
    written = write_shards(state, Path(folder) / f"rank-{rank}")
    torch.distributed.barrier()
    # a fresh node's restore folder: the index and shared state, and what this rank needs
    restore = Path(folder) / f"restore-{rank}"
    restore.mkdir()
    for name in (METADATA, SHARED):
        shutil.copy(Path(folder) / "rank-0" / name, restore / name)
    needed = needed_files(restore, rank, world)
    for name in needed:
        owner = next(p for p in Path(folder).glob("rank-*") if (p / name).exists())
        shutil.copy(owner / name, restore / name)
    ctx.close()

    torch.manual_seed(1)  # a different initialisation, overwritten by the restore
    ctx, model, optimizer = make()
    restored = read_shards(
        restore, model=model, optimizers=[optimizer], device=ctx.device, weights_only=True
    )
    model.load_state_dict(restored["model"])
    optimizer.load_state_dict(restored["optimizer"])
    after = _full({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    optimizer.zero_grad()
    model(torch.randn(4, 6, generator=gen)).pow(2).sum().backward()
    optimizer.step()  # and training goes on from there
    ctx.close()
    return {
        "saved": saved,
        "after": after,
        "epoch": restored["epoch"],
        "written": written,
        "needed": sorted(needed),
    }


def test_each_rank_writes_its_own_file_and_restores_from_it_alone(tmp_path: Path) -> None:
    results = run_ranks(_save_then_restore_own_files, str(tmp_path))
    assert results[0]["written"] == [".metadata", "__0_0.distcp", "shared.pt"]
    assert results[1]["written"] == ["__1_0.distcp"]
    assert results[0]["needed"] == ["__0_0.distcp"]
    assert results[1]["needed"] == ["__1_0.distcp"]  # not rank 0's shards
    for result in results:
        assert result["epoch"] == 7
        torch.testing.assert_close(result["after"]["model"], result["saved"]["model"])
        torch.testing.assert_close(
            result["after"]["optimizer"]["state"], result["saved"]["optimizer"]["state"]
        )
        assert (
            result["after"]["optimizer"]["param_groups"]
            == (result["saved"]["optimizer"]["param_groups"])
        )


def _managed_rank(
    rank: int,
    world: int,
    url: str,
    token: str,
    trial_id: int,
    attempt: int,
    restore: str,
    spool: str,
) -> dict[str, Any]:
    """One rank of a managed trial: a real control plane's API, this rank's own spool (as on a
    node of its own)."""
    import trainhub
    from trainhub import models
    from trainhub.runtime import protocol

    own_spool = Path(spool) / f"rank-{rank}"
    os.environ.update(
        {
            protocol.ENV_API_URL: url,
            protocol.ENV_TOKEN: token,
            protocol.ENV_TRIAL_ID: str(trial_id),
            protocol.ENV_ATTEMPT: str(attempt),
            protocol.ENV_SPOOL_DIR: str(own_spool),
            protocol.ENV_DISTRIBUTED: json.dumps({"memory": {"fsdp": True}}),
        }
    )
    if restore:
        os.environ[protocol.ENV_RESTORE_CHECKPOINT] = restore
    torch.manual_seed(attempt)
    ctx = trainhub.init()
    model = ctx.prepare_model(models.create("mlp", in_features=6, hidden=(8, 8)))
    optimizer = ctx.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    restored = ctx.restore()
    if restored is not None:
        model.load_state_dict(restored["model"])
        optimizer.load_state_dict(restored["optimizer"])
    else:
        gen = torch.Generator().manual_seed(rank)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(4, 6, generator=gen)).pow(2).sum().backward()
            optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 2}
        handle = ctx.save_checkpoint(state, step=2, metrics={"loss": 1.0})
        assert handle is not None
        assert handle.wait(120), handle.error
    local = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    ctx.close(timeout_s=120)
    fetched = own_spool / "restore"
    return {
        "local": local,
        "step": None if restored is None else restored["step"],
        "fetched": sorted(
            p.name for p in fetched.rglob("*") if p.is_file() and not p.name.endswith(".lock")
        ),
    }


def test_managed_ranks_upload_their_own_files_and_each_restores_its_own(tmp_path: Path) -> None:
    """Through a real API (folder store, the control plane's route): every rank's checkpoint
    thread uploads its files, the last report publishes; a new attempt on "nodes" of their own
    restores, each rank fetching the index, the shared state and its own file only."""
    from tests.api.test_auth import submit
    from tests.api.trials import start_attempt
    from tests.fixtures.api import build_api, serve

    api = build_api(f"sqlite:///{tmp_path / 'trainhub.db'}", tmp_path)
    with api.client:
        user = api.user("alice", "vision")
        trial_id = submit(api, user).json()["trials"][0]["id"]
        first = start_attempt(api, trial_id, 1)["Authorization"].removeprefix("Bearer ")
        with serve(api.client.app) as port:
            url = f"http://127.0.0.1:{port}"
            saved = run_ranks(_managed_rank, url, first, trial_id, 1, "", str(tmp_path / "spool-1"))
            listed = api.client.get(
                f"/api/v1/trials/{trial_id}/checkpoints", headers=api.headers(user)
            ).json()["data"]
            assert [c["step"] for c in listed] == [2]
            second = start_attempt(api, trial_id, 2)["Authorization"].removeprefix("Bearer ")
            restored = run_ranks(
                _managed_rank,
                url,
                second,
                trial_id,
                2,
                str(listed[0]["id"]),
                str(tmp_path / "spool-2"),
            )
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]
    assert [r["fetched"] for r in restored] == [
        [".metadata", "__0_0.distcp", "shared.pt"],
        [".metadata", "__1_0.distcp", "shared.pt"],  # not rank 0's shards
    ]
    for before, after in zip(saved, restored, strict=True):
        assert after["step"] == 2
        torch.testing.assert_close(after["local"], before["local"])
