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

That packed form is what standalone mode keeps. With a control plane (ADR 0040)
:func:`write_shards` writes each rank's files for its own upload, one object per file: rank R's
rows of every row-sharded DTensor (``__R_0.distcp``), and on rank 0 the index (``.metadata``)
and everything not sharded (``shared.pt``); :func:`needed_files` says which files a rank needs
for its rows and :func:`read_shards` loads them straight into DTensors, no full tensor on any
rank.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from trainhub.runtime.distributed.parallel import ParallelModel

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


def restore_parallel(
    packed: Mapping[str, Any], parallel: ParallelModel, optimizers: Sequence[torch.optim.Optimizer]
) -> dict[str, Any]:
    """A checkpoint of a pipeline/tensor-parallel trial, of any layout, loaded into this
    rank's stage and the last optimizer of ``ctx.prepare_optimizer`` (each rank reads only the
    shards its stage needs); the whole state returned."""
    from trainhub.runtime.distributed.parallel import load_sharded

    with tempfile.TemporaryDirectory(prefix="trainhub-dcp-") as folder:
        for name, data in packed[PACKED_KEY].items():
            (Path(folder) / name).write_bytes(data.numpy().tobytes())
        return load_sharded(folder, parallel, optimizers)


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


# --- one object per rank's file (managed mode with a control plane; ADR 0040) ---

SHARED = "shared.pt"  # what is not sharded (rank 0's replica): plain tensors, numbers, lists
METADATA = ".metadata"  # torch.distributed.checkpoint's index of every shard
_ABSENT = object()


def _row_sharded(value: Any) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return (
        isinstance(value, DTensor)
        and value.device_mesh.ndim == 1
        and tuple(value.placements) == (Shard(0),)
    )


def _full_tensors(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()  # a collective: every rank walks the same structure
    if isinstance(value, dict):
        return {k: _full_tensors(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_full_tensors(v) for v in value)
    return value


def _split(value: Any) -> tuple[Any, Any]:
    """(the row-sharded DTensors, everything else) of a state, each keeping the dicts'
    structure; ``_ABSENT`` where a side has nothing."""
    if isinstance(value, dict):
        sharded: dict[Any, Any] = {}
        shared: dict[Any, Any] = {}
        for key, item in value.items():
            mine, rest = _split(item)
            if mine is not _ABSENT:
                sharded[key] = mine
            if rest is not _ABSENT:
                shared[key] = rest
        if not sharded:
            return _ABSENT, shared
        return sharded, (shared if shared else _ABSENT)
    if _row_sharded(value):
        return value, _ABSENT
    return _ABSENT, _full_tensors(value)


def _merge(sharded: Any, shared: Any) -> Any:
    if sharded is _ABSENT:
        return shared
    if shared is _ABSENT:
        return sharded
    merged = dict(shared)
    # the index's flattening may give integer keys (an optimizer's state) back as strings;
    # shared.pt, a plain torch.save, kept their type: that one wins
    by_text = {str(key): key for key in shared}
    for key, value in sharded.items():
        original = by_text.get(str(key), key)
        merged[original] = _merge(value, shared.get(original, _ABSENT))
    return merged


def write_shards(state: Mapping[str, Any], folder: Path) -> list[str]:
    """Save ``state`` on every rank (a collective) into this rank's ``folder``: its own
    shards (``__R_0.distcp``); rank 0 also the index (``.metadata``) and what is not sharded
    (``shared.pt``). Returns the names of the files this rank wrote."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    folder.mkdir(parents=True, exist_ok=True)
    sharded, shared = _split(dict(state))
    if sharded is not _ABSENT:  # every rank walks the same structure: all save, or none
        save(sharded, storage_writer=FileSystemWriter(folder))
    if dist.get_rank() == 0:
        torch.save({} if shared is _ABSENT else shared, folder / SHARED)
    return sorted(os.listdir(folder))


def needed_files(folder: Path, rank: int, world_size: int) -> set[str]:
    """The files of a saved set that ``rank`` of ``world_size`` reads: those holding rows of
    its shard of each tensor (with the world size it was saved with: its own file only)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (folder / METADATA).exists():
        return set()
    metadata = FileSystemReader(folder).read_metadata()
    needed: set[str] = set()
    storage = metadata.storage_data or {}
    for index, info in storage.items():
        entry = metadata.state_dict_metadata[index.fqn]
        if not isinstance(entry, TensorStorageMetadata) or len(entry.size) == 0:
            needed.add(info.relative_path)
            continue
        rows = entry.size[0]
        per_rank = -(-rows // world_size)
        low, high = min(rows, rank * per_rank), min(rows, (rank + 1) * per_rank)
        offsets = tuple(index.offset or ())
        chunk = next((c for c in entry.chunks if tuple(c.offsets) == offsets), None)
        if chunk is None:
            needed.add(info.relative_path)
            continue
        start, length = chunk.offsets[0], chunk.sizes[0]
        if low < high and start < high and low < start + length:
            needed.add(info.relative_path)
    return needed


def read_shards(
    folder: Path,
    *,
    model: nn.Module | None,
    optimizers: Sequence[torch.optim.Optimizer],
    device: torch.device,
    weights_only: bool,
) -> dict[str, Any]:
    """Load a set saved by :func:`write_shards` (a collective): this rank's rows of every
    sharded tensor straight into DTensors on the model's mesh, merged with ``shared.pt``, then
    distributed as the model's and optimizers' parameters are now."""
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor import empty as dtensor_empty

    shared: Any = torch.load(folder / SHARED, map_location=device, weights_only=weights_only)
    model_state = model.state_dict() if model is not None else {}
    sharded: Any = _ABSENT
    if (folder / METADATA).exists():
        metadata = FileSystemReader(folder).read_metadata()
        mesh = next((v.device_mesh for v in model_state.values() if isinstance(v, DTensor)), None)
        if mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        flat: dict[str, Any] = {}
        for fqn, entry in metadata.state_dict_metadata.items():
            if isinstance(entry, TensorStorageMetadata):
                flat[fqn] = dtensor_empty(
                    tuple(entry.size),
                    dtype=entry.properties.dtype,
                    device_mesh=mesh,
                    placements=[Shard(0)],
                )
        load(flat, storage_reader=FileSystemReader(folder))
        mappings = metadata.planner_data or {}
        sharded = unflatten_state_dict(flat, mappings) if mappings else flat
    full = _merge(sharded, shared)
    return _reshard(full, model_state, optimizers)  # type: ignore[no-any-return]
