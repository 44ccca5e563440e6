"""Checkpoints of FSDP trials: every rank saves its shards, restore re-shards them.

``Context.save_checkpoint`` under ``memory.fsdp`` calls :func:`pack_sharded` on every rank (a
collective): the state is written with ``torch.distributed.checkpoint`` (each rank writes only
its own shards, rank 0 the metadata) into a private temporary folder per rank, and rank 0
gathers the files into one checkpoint, ``{PACKED_KEY: {file name: bytes as a uint8 tensor}}``,
which the checkpoint store saves and uploads like any other (so ranks need no shared file
system). ``Context.restore`` recognises such a checkpoint and calls :func:`unpack_sharded`: the
files are written back, read into full tensors, and every entry that belongs to the prepared
model or to an optimizer made with ``ctx.prepare_optimizer`` is distributed again the way that
parameter is sharded now (a different world size works too). The script's own
``model.load_state_dict(state["model"])`` and ``optimizer.load_state_dict(...)`` then see
sharded tensors, as they would have without a checkpoint.

Limit: the gathered files pass through rank 0's memory, and restore holds full tensors on every
rank for a moment; for models that only fit sharded, keep checkpoints on a shared file system.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

PACKED_KEY = "trainhub_sharded_checkpoint"


def is_packed(state: Mapping[str, Any] | None) -> bool:
    return state is not None and set(state) == {PACKED_KEY}


def pack_sharded(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """Save ``state`` (with DTensors) on every rank; rank 0 gets the packed checkpoint."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    with tempfile.TemporaryDirectory(prefix="trainhub-dcp-") as folder:
        save(dict(state), storage_writer=FileSystemWriter(folder))
        files = {name: (Path(folder) / name).read_bytes() for name in os.listdir(folder)}
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(files, gathered, dst=0)
    if gathered is None:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        for name, data in part.items():
            merged[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return {PACKED_KEY: merged}


def unpack_sharded(
    packed: Mapping[str, Any],
    *,
    model: nn.Module | None,
    optimizers: Sequence[torch.optim.Optimizer],
    weights_only: bool,
) -> dict[str, Any]:
    """The saved state with the model's and optimizers' entries sharded as they are now."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="trainhub-dcp-") as folder:
        for name, data in packed[PACKED_KEY].items():
            (Path(folder) / name).write_bytes(data.numpy().tobytes())
        full_path = Path(folder) / "full.pt"
        dcp_to_torch_save(folder, full_path)
        full: dict[str, Any] = torch.load(full_path, weights_only=weights_only)
    model_state = model.state_dict() if model is not None else {}
    return _reshard(full, model_state, optimizers)  # type: ignore[no-any-return]


def _reshard(
    obj: Any, model_state: Mapping[str, Any], optimizers: Sequence[torch.optim.Optimizer]
) -> Any:
    if not isinstance(obj, dict):
        return obj
    if model_state and set(obj) == set(model_state):
        return {k: _like(v, model_state[k]) for k, v in obj.items()}
    if set(obj) >= {"state", "param_groups"}:
        for optimizer in optimizers:
            resharded = _reshard_optimizer(obj, optimizer)
            if resharded is not None:
                return resharded
    return {k: _reshard(v, model_state, optimizers) for k, v in obj.items()}


def _reshard_optimizer(
    state_dict: dict[str, Any], optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
    if len(saved_ids) != len(params):
        return None
    by_id = dict(zip(saved_ids, params, strict=True))
    # the checkpoint's flattening turns the state's integer keys into strings: turn them back,
    # or ``load_state_dict`` would silently find no state for any parameter
    state = {
        int(key): {name: _like(value, by_id[int(key)]) for name, value in entry.items()}
        for key, entry in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def _like(value: Any, template: Any) -> Any:
    """``value`` (a full tensor) distributed as ``template`` is, where shapes agree."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if (
        isinstance(template, DTensor)
        and isinstance(value, torch.Tensor)
        and not isinstance(value, DTensor)
        and tuple(value.shape) == tuple(template.shape)
    ):
        return distribute_tensor(
            value.to(template.device, template.dtype), template.device_mesh, template.placements
        )
    return value
