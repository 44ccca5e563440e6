"""The worker side of the parameter server: shard the flat parameters, push, pull.

Every rank calls :func:`connect_parameter_server` with the same model. The flat parameter
vector is cut into ``num_shards`` contiguous, nearly equal slices; shard ``i`` is served by rank
``i mod world_size`` (:mod:`.server`), initialised from rank 0's weights, which every rank then
pulls, so all start from the same point (the role DDP's initial broadcast plays). Addresses and
the connection secret travel over the trial's process group; nothing involves Ray.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import socket
import struct
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.config import ParameterServerConfig
from trainhub.runtime.distributed.ps.server import (
    SECRET_BYTES,
    ShardServer,
    encode,
    reachable_host,
)
from trainhub.runtime.distributed.ps.shard import Hyper, ParameterShard

_LENGTH = struct.Struct(">I")


def shard_bounds(numel: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of nearly equal size covering ``0..numel``."""
    if num_shards > numel:
        raise ValueError(f"{num_shards} shards for {numel} parameters: use at most {numel}")
    edges = np.linspace(0, numel, num_shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


class ShardConnection:
    """A blocking connection to the server hosting one shard."""

    def __init__(self, address: tuple[str, int], secret: bytes, shard: int) -> None:
        self.shard = shard
        self._sock = socket.create_connection(address, timeout=None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(secret)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self._sock.sendall(encode({**header, "shard": self.shard}, payload))

    def receive(self) -> tuple[dict[str, Any], bytes]:
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size))
        header: dict[str, Any] = json.loads(self._read(length))
        payload = self._read(int(header["nbytes"]))
        if "error" in header:
            raise RuntimeError(f"parameter-server shard {self.shard}: {header['error']}")
        return header, payload

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError(f"parameter-server shard {self.shard} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._sock.close()


class ParameterServerClient:
    """One worker's connection to the shards of a trial.

    Args:
        params: the model's parameters (their order defines the flat vector).
        connections: one per shard, in shard order.
        bounds: each shard's slice of the flat vector.
        worker: this worker's index (its rank).
        server: the shard server this rank hosts, if any (stopped by :meth:`close`).
        meter: receives the bytes pushed and pulled.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        connections: list[ShardConnection],
        bounds: list[tuple[int, int]],
        *,
        worker: int,
        server: ShardServer | None = None,
        meter: CommMeter | None = None,
    ) -> None:
        self.params = params
        self.connections = connections
        self.bounds = bounds
        self.worker = worker
        self.server = server
        self.meter = meter if meter is not None else CommMeter()
        self.clock = 0
        self.versions = [0] * len(connections)

    def _flat_grads(self) -> np.ndarray:
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
            for p in self.params
        ]
        flat: np.ndarray = torch.cat(parts).to("cpu", torch.float32).numpy()
        return flat

    def _load(self, answers: list[tuple[dict[str, Any], bytes]]) -> None:
        flat = torch.from_numpy(
            np.concatenate([np.frombuffer(data, dtype=np.float32) for _, data in answers])
        )
        self.versions = [int(header["version"]) for header, _ in answers]
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n

    def _exchange(self, headers: list[dict[str, Any]], payloads: list[bytes]) -> list[Any]:
        # send to every shard first, then read: under ``sync`` a shard answers only once every
        # worker's gradient for the step has arrived, at every shard
        for connection, header, payload in zip(self.connections, headers, payloads, strict=True):
            connection.send(header, payload)
        return [connection.receive() for connection in self.connections]

    def pull(self) -> None:
        """Overwrite the local parameters with the shards' current weights."""
        n = len(self.connections)
        self._load(self._exchange([{"op": "pull"}] * n, [b""] * n))

    def step(self, hyper: Hyper) -> None:
        """Push this worker's gradients, wait as the consistency model says, load the weights."""
        flat = self._flat_grads()
        headers = [
            {
                "op": "push_pull",
                "worker": self.worker,
                "clock": self.clock,
                "hyper": asdict(hyper),
                "based_on": version,
            }
            for version in self.versions
        ]
        with self.meter.sync():
            answers = self._exchange(headers, [flat[a:b].tobytes() for a, b in self.bounds])
        self.meter.add_point_to_point(2 * flat.nbytes)  # gradient out, weights back
        self._load(answers)
        self.clock += 1

    def trace(self) -> list[list[dict[str, Any]]]:
        n = len(self.connections)
        return [header["trace"] for header, _ in self._exchange([{"op": "trace"}] * n, [b""] * n)]

    def close(self) -> None:
        """Disconnect, and stop the shards this rank serves.

        Every rank calls it after its last step; with several ranks it waits (a barrier) until
        every rank is done, since a rank's shards serve the others until then.
        """
        for connection in self.connections:
            connection.close()
        self.connections = []
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        if self.server is not None:
            self.server.close()
            self.server = None


def host_shards(
    flat: torch.Tensor,
    bounds: list[tuple[int, int]],
    mine: list[int],
    *,
    num_workers: int,
    config: ParameterServerConfig,
    secret: bytes,
    host: str,
) -> ShardServer | None:
    """Start the server of the shards in ``mine`` (this rank's), from the flat weights."""
    if not mine:
        return None
    shards = {
        i: ParameterShard(
            flat[bounds[i][0] : bounds[i][1]].numpy(),
            num_workers,
            str(config.consistency),
            config.staleness,
        )
        for i in mine
    }
    return ShardServer(shards, secret, host)


def _rendezvous_host() -> str:
    """Where the process group met (``MASTER_ADDR``, else the host of its TCP store): the
    interface that reaches it is one every rank of the trial can reach this rank on."""
    address = os.environ.get("MASTER_ADDR")
    if address:
        return address
    if dist.is_initialized():
        try:
            store: Any = dist.distributed_c10d._get_default_store()
        except (RuntimeError, ValueError):
            store = None
        while store is not None and hasattr(store, "underlying_store"):
            store = store.underlying_store
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
    return "127.0.0.1"


def connect_parameter_server(
    model: nn.Module,
    config: ParameterServerConfig,
    *,
    meter: CommMeter | None = None,
) -> ParameterServerClient:
    """Start this rank's shards, connect to every shard, and pull the initial weights.

    Call on every rank, after ``torch.distributed`` is initialised (or in a single process).
    Shard ``i`` runs in rank ``i mod world_size``; rank 0's weights initialise every shard.
    """
    initialized = dist.is_initialized()
    rank = dist.get_rank() if initialized else 0
    world_size = dist.get_world_size() if initialized else 1
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    bounds = shard_bounds(numel, config.num_shards)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).to("cpu", torch.float32)
    secret = secrets.token_bytes(SECRET_BYTES)
    if initialized and world_size > 1:
        if dist.get_backend() == "nccl":
            flat_dev = flat.to(params[0].device)
            dist.broadcast(flat_dev, src=0)
            flat = flat_dev.cpu()
        else:
            dist.broadcast(flat, src=0)
        shared = [secret]
        dist.broadcast_object_list(shared, src=0)
        secret = shared[0]
    host = reachable_host(_rendezvous_host())
    mine = [i for i in range(config.num_shards) if i % world_size == rank]
    server = host_shards(
        flat, bounds, mine, num_workers=world_size, config=config, secret=secret, host=host
    )
    addresses: list[Any] = [server.address if server is not None else None]
    if initialized and world_size > 1:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, addresses[0])
        addresses = gathered
    connections = [
        ShardConnection(tuple(addresses[i % world_size]), secret, i)
        for i in range(config.num_shards)
    ]
    client = ParameterServerClient(
        params, connections, bounds, worker=rank, server=server, meter=meter
    )
    client.pull()
    return client
