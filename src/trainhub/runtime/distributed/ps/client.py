"""The worker side of the parameter server: shard the flat parameters, push, pull.

Every rank calls :func:`connect_parameter_server` with the same model. Rank 0 creates the shard
actors from its initial weights; every rank then pulls them, so all start from the same point
(the role DDP's initial broadcast plays). The flat parameter vector is cut into ``num_shards``
contiguous, nearly equal slices, one per shard.
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.config import ParameterServerConfig
from trainhub.runtime.distributed.ps import actors
from trainhub.runtime.distributed.ps.shard import Hyper


def shard_bounds(numel: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of nearly equal size covering ``0..numel``."""
    if num_shards > numel:
        raise ValueError(f"{num_shards} shards for {numel} parameters: use at most {numel}")
    edges = np.linspace(0, numel, num_shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


class ParameterServerClient:
    """One worker's connection to the shards of a trial.

    Args:
        params: the model's parameters (their order defines the flat vector).
        shards: the shard actor handles.
        bounds: each shard's slice of the flat vector.
        worker: this worker's index (its rank).
        meter: receives the bytes pushed and pulled.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        shards: list[Any],
        bounds: list[tuple[int, int]],
        *,
        worker: int,
        owns_shards: bool,
        meter: CommMeter | None = None,
    ) -> None:
        self.params = params
        self.shards = shards
        self.bounds = bounds
        self.worker = worker
        self.owns_shards = owns_shards
        self.meter = meter if meter is not None else CommMeter()
        self.clock = 0
        self.versions = [0] * len(shards)

    def _flat_grads(self) -> np.ndarray:
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
            for p in self.params
        ]
        flat: np.ndarray = torch.cat(parts).to("cpu", torch.float32).numpy()
        return flat

    def _load(self, answers: list[tuple[np.ndarray, int]]) -> None:
        flat = torch.from_numpy(np.concatenate([weights for weights, _ in answers]))
        self.versions = [version for _, version in answers]
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n

    def pull(self) -> None:
        """Overwrite the local parameters with the shards' current weights."""
        self._load(actors.pull_all(self.shards))

    def step(self, hyper: Hyper) -> None:
        """Push this worker's gradients, wait as the consistency model says, load the weights."""
        flat = self._flat_grads()
        grads = [flat[a:b] for a, b in self.bounds]
        with self.meter.sync():
            answers = actors.push_pull_all(
                self.shards, self.worker, self.clock, grads, hyper, self.versions
            )
        self.meter.add_point_to_point(2 * flat.nbytes)  # gradient out, weights back
        self._load(answers)
        self.clock += 1

    def trace(self) -> list[list[dict[str, Any]]]:
        return actors.trace_all(self.shards)

    def close(self) -> None:
        """Rank 0 stops the shards (call after the last step of every rank)."""
        if self.owns_shards:
            actors.kill_shards(self.shards)


def _agree_on_name(name: str | None) -> str:
    if name is not None:
        return name
    trial = os.environ.get("TRAINHUB_TRIAL_ID")
    if trial:
        return f"trial-{trial}-attempt-{os.environ.get('TRAINHUB_ATTEMPT', '1')}"
    chosen = [uuid.uuid4().hex[:12]]
    if dist.is_initialized():
        dist.broadcast_object_list(chosen, src=0)
    return f"ps-{chosen[0]}"


def connect_parameter_server(
    model: nn.Module,
    config: ParameterServerConfig,
    *,
    name: str | None = None,
    meter: CommMeter | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    ray_address: str | None = None,
) -> ParameterServerClient:
    """Create (rank 0) or find (other ranks) the shards, and pull the initial weights.

    Call on every rank. ``rank``/``world_size`` default to ``torch.distributed``'s (or 0/1).
    ``name`` must be unique among running trials; default: from ``TRAINHUB_TRIAL_ID``.
    """
    if rank is None or world_size is None:
        initialized = dist.is_initialized()
        rank = dist.get_rank() if initialized else 0
        world_size = dist.get_world_size() if initialized else 1
    actors.ensure_ray(ray_address)
    name = _agree_on_name(name)
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    bounds = shard_bounds(numel, config.num_shards)
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in params]).to("cpu", torch.float32)
        shards = actors.create_shards(
            name,
            [flat[a:b].numpy() for a, b in bounds],
            num_workers=world_size,
            consistency=config.consistency,
            staleness=config.staleness,
            cpus_per_shard=config.cpus_per_shard,
        )
    else:
        shards = actors.find_shards(name, config.num_shards)
    client = ParameterServerClient(
        params, shards, bounds, worker=rank, owns_shards=rank == 0, meter=meter
    )
    client.pull()
    return client
