"""Parameter-server shards as Ray actors: the only module of the runtime that imports Ray.

The runtime otherwise stays free of Ray (it runs under plain ``torchrun`` too); strategy ``ps``
needs a Ray cluster by nature, so this one module is exempt in the import-linter contract (see
docs/adr/0004-communication-strategies.md). Shards are named ``{name}-shard-{i}`` in the Ray
namespace ``trainhub-ps``; rank 0 creates them, the other ranks look them up by name.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import ray

from trainhub.runtime.distributed.ps.shard import Hyper, ParameterShard

NAMESPACE = "trainhub-ps"


def ensure_ray(address: str | None = None) -> None:
    """Connect this process to the Ray cluster (``RAY_ADDRESS``, else the local one).

    Ray turns token authentication on by itself only for clusters it discovers, not for an
    explicit address; do what it does for those when a token is available (as the executor
    does). ``RAY_AUTH_MODE`` set explicitly wins.
    """
    if not ray.is_initialized():
        _enable_token_auth_if_available()
        ray.init(
            address=address or os.environ.get("RAY_ADDRESS", "auto"),
            namespace=NAMESPACE,
            log_to_driver=False,
        )


def create_shards(
    name: str,
    slices: list[np.ndarray],
    *,
    num_workers: int,
    consistency: str,
    staleness: int,
    cpus_per_shard: float,
) -> list[Any]:
    """Start one shard actor per slice, spread over the cluster's nodes."""
    remote_shard = ray.remote(ParameterShard)
    return [
        remote_shard.options(
            name=f"{name}-shard-{i}",
            namespace=NAMESPACE,
            num_cpus=cpus_per_shard,
            scheduling_strategy="SPREAD",
            max_concurrency=max(16, 4 * num_workers),
        ).remote(part, num_workers, consistency, staleness)
        for i, part in enumerate(slices)
    ]


def find_shards(name: str, num_shards: int, *, timeout_s: float = 60.0) -> list[Any]:
    """The shard actors rank 0 created, waiting for them up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return [
                ray.get_actor(f"{name}-shard-{i}", namespace=NAMESPACE) for i in range(num_shards)
            ]
        except ValueError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"parameter-server shards {name!r} did not appear within {timeout_s} s"
                ) from None
            time.sleep(0.1)


def push_pull_all(
    shards: list[Any],
    worker: int,
    clock: int,
    grads: list[np.ndarray],
    hyper: Hyper,
    versions: list[int],
) -> list[tuple[np.ndarray, int]]:
    """Push one slice to each shard concurrently; their answers in shard order."""
    refs = [
        shard.push_pull.remote(worker, clock, grad, hyper, version)
        for shard, grad, version in zip(shards, grads, versions, strict=True)
    ]
    answers: list[tuple[np.ndarray, int]] = ray.get(refs)
    return answers


def pull_all(shards: list[Any]) -> list[tuple[np.ndarray, int]]:
    answers: list[tuple[np.ndarray, int]] = ray.get([s.pull.remote() for s in shards])
    return answers


def trace_all(shards: list[Any]) -> list[list[dict[str, Any]]]:
    traces: list[list[dict[str, Any]]] = ray.get([s.trace.remote() for s in shards])
    return traces


def kill_shards(shards: list[Any]) -> None:
    for shard in shards:
        ray.kill(shard)


def _enable_token_auth_if_available() -> None:
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
