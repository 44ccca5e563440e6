"""Parameter server: consistency models and optimizers on the bare shard, then over TCP.

The shard tests drive :class:`ParameterShard` with asyncio directly (workers are coroutines with
chosen speeds). The TCP tests serve shards from this process as a rank does; workers are
threads, each with its own model and client, like ranks would be. The last tests run strategy
``ps`` on two real gloo ranks, which host the shards themselves: no Ray anywhere.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.distributed.launch import run_ranks
from tests.distributed.training import evaluate, train_digits
from trainhub import data, models
from trainhub.data.loader import make_loader
from trainhub.runtime.distributed.config import ParameterServerConfig
from trainhub.runtime.distributed.ps.client import (
    ParameterServerClient,
    ShardConnection,
    host_shards,
    shard_bounds,
)
from trainhub.runtime.distributed.ps.optimizer import ParameterServerOptimizer, shard_hyper
from trainhub.runtime.distributed.ps.server import SECRET_BYTES, encode
from trainhub.runtime.distributed.ps.shard import Hyper, ParameterShard

# --- the shard alone -------------------------------------------------------------------------


def _run_workers(
    shard: ParameterShard, steps: int, delays: list[float], grad_of: Any
) -> list[list[int]]:
    """Each worker pushes ``steps`` gradients, sleeping ``delays[w]`` before each."""

    async def worker(w: int) -> list[int]:
        version, seen = 0, []
        for clock in range(steps):
            await asyncio.sleep(delays[w])
            _, version = await shard.push_pull(w, clock, grad_of(w, clock), Hyper(lr=0.1), version)
            seen.append(version)
        return seen

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(worker(w) for w in range(len(delays)))))

    return asyncio.run(main())


def test_sync_applies_the_mean_once_per_step() -> None:
    shard = ParameterShard(np.zeros(3, np.float32), num_workers=2, consistency="sync")
    seen = _run_workers(shard, 3, [0.0, 0.003], lambda w, c: np.full(3, w + 1.0, np.float32))
    assert seen == [[1, 2, 3], [1, 2, 3]]  # both see the same versions
    np.testing.assert_allclose(shard.weights, -0.1 * 1.5 * 3)


def test_sync_rejects_a_skipped_step() -> None:
    shard = ParameterShard(np.zeros(2, np.float32), num_workers=1, consistency="sync")
    with pytest.raises(RuntimeError, match="every worker must push every step"):
        asyncio.run(shard.push_pull(0, 5, np.zeros(2, np.float32), Hyper(lr=0.1), 0))


def test_async_applies_every_gradient_at_once() -> None:
    shard = ParameterShard(np.zeros(2, np.float32), num_workers=2, consistency="async")
    seen = _run_workers(shard, 5, [0.0, 0.01], lambda w, c: np.ones(2, np.float32))
    assert shard.version == 10
    assert seen[0][-1] <= 6  # the fast worker finished long before the slow one
    gaps = [e.clock - e.min_clock for e in shard.events]
    assert max(gaps) >= 3  # unbounded: the fast worker ran far ahead


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_ssp_never_exceeds_the_staleness_bound(staleness: int) -> None:
    shard = ParameterShard(np.zeros(2, np.float32), 3, "ssp", staleness=staleness)
    _run_workers(shard, 12, [0.0, 0.002, 0.006], lambda w, c: np.ones(2, np.float32))
    gaps = [e.clock - e.min_clock for e in shard.events]
    assert max(gaps) <= staleness
    assert max(gaps) == staleness  # and the fast worker did use its slack
    assert shard.version == 36


def test_momentum_and_weight_decay_match_torch_sgd() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)
    shard = ParameterShard(w.detach().numpy().copy(), 1, "sync")
    hyper = Hyper(lr=0.1, momentum=0.9, weight_decay=0.01)
    for i in range(4):
        g = torch.randn(4)
        w.grad = g.clone()
        opt.step()
        asyncio.run(shard.push_pull(0, i, g.numpy(), hyper, i))
    np.testing.assert_allclose(shard.weights, w.detach().numpy(), rtol=1e-6)


def test_shard_bounds_cover_the_vector() -> None:
    assert shard_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    with pytest.raises(ValueError, match="at most 2"):
        shard_bounds(2, 3)


def test_adam_and_adamw_match_torch() -> None:
    for kind, cls in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        torch.manual_seed(0)
        w = nn.Parameter(torch.randn(5))
        opt = cls([w], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
        shard = ParameterShard(w.detach().numpy().copy(), 1, "sync")
        hyper = shard_hyper(opt)
        assert hyper.kind == kind
        for i in range(5):
            g = torch.randn(5)
            w.grad = g.clone()
            opt.step()
            asyncio.run(shard.push_pull(0, i, g.numpy(), hyper, i))
        np.testing.assert_allclose(shard.weights, w.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_nesterov_matches_torch_and_other_optimizers_are_refused() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    shard = ParameterShard(w.detach().numpy().copy(), 1, "sync")
    for i in range(4):
        g = torch.randn(4)
        w.grad = g.clone()
        opt.step()
        asyncio.run(shard.push_pull(0, i, g.numpy(), shard_hyper(opt), i))
    np.testing.assert_allclose(shard.weights, w.detach().numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="SGD, Adam and AdamW"):
        shard_hyper(torch.optim.RMSprop([w]))


# --- over TCP, shards served from this process (as a rank serves them) ------------------------


class _Shards:
    """Shards of ``template``'s weights served in-process; ``connect`` gives a worker a client."""

    def __init__(self, template: nn.Module, config: ParameterServerConfig, workers: int) -> None:
        params = list(template.parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.bounds = shard_bounds(flat.numel(), config.num_shards)
        self.secret = os.urandom(SECRET_BYTES)
        mine = list(range(config.num_shards))
        server = host_shards(
            flat,
            self.bounds,
            mine,
            num_workers=workers,
            config=config,
            secret=self.secret,
            host="127.0.0.1",
        )
        assert server is not None
        self.server = server

    def connect(self, model: nn.Module, rank: int) -> ParameterServerClient:
        connections = [
            ShardConnection(self.server.address, self.secret, i) for i in range(len(self.bounds))
        ]
        client = ParameterServerClient(
            list(model.parameters()), connections, self.bounds, worker=rank
        )
        client.pull()
        return client


def _threads(num: int, fn: Any) -> list[Any]:
    results: list[Any] = [None] * num
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(num)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_sync_equals_the_optimizer_on_the_combined_batch(optimizer: str) -> None:
    torch.manual_seed(0)
    template = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))]
    batches *= 4

    def make(params: Any) -> torch.optim.Optimizer:
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)

    shards = _Shards(template, ParameterServerConfig(num_shards=3, consistency="sync"), 2)
    clients: list[Any] = [None, None]

    def worker(rank: int) -> torch.Tensor:
        model = copy.deepcopy(template)
        if rank == 1:
            with torch.no_grad():  # start elsewhere: the initial pull must overwrite this
                for p in model.parameters():
                    p.add_(1.0)
        client = shards.connect(model, rank)
        clients[rank] = client
        opt = ParameterServerOptimizer(make(model.parameters()), client)
        for x, y in batches:
            half = slice(rank * 4, rank * 4 + 4)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[half]), y[half]).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    try:
        got = _threads(2, worker)
    finally:
        for client in clients:
            if client is not None:
                client.close()
        shards.server.close()
    reference = copy.deepcopy(template)
    ref_opt = make(reference.parameters())
    for x, y in batches:
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    expected = torch.cat([p.detach().flatten() for p in reference.parameters()])
    for weights in got:
        torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    assert clients[0].meter.snapshot().payload_bytes == 4 * 2 * 4 * expected.numel()


def test_a_connection_without_the_secret_gets_nothing() -> None:
    import socket

    shards = _Shards(nn.Linear(3, 2), ParameterServerConfig(num_shards=1), 1)
    try:
        with socket.create_connection(shards.server.address, timeout=10) as sock:
            sock.sendall(b"x" * SECRET_BYTES + encode({"op": "pull", "shard": 0}))
            assert sock.recv(1024) == b""  # closed without an answer
    finally:
        shards.server.close()


def _train_threads(consistency: str, staleness: int, epochs: int) -> tuple[list[float], Any]:
    splits = data.load("digits")
    config = ParameterServerConfig(num_shards=2, consistency=consistency, staleness=staleness)
    torch.manual_seed(0)
    shards = _Shards(models.create("mlp", in_features=64, hidden=(64,)), config, 2)
    clients: list[Any] = [None, None]

    def worker(rank: int) -> float:
        torch.manual_seed(rank)
        model = models.create("mlp", in_features=64, hidden=(64,))
        client = shards.connect(model, rank)
        clients[rank] = client
        opt = ParameterServerOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), client
        )
        loader = make_loader(splits.train, 32, rank=rank, world_size=2, seed=1)
        for _ in range(epochs):
            for x, y in loader:
                if rank == 1:
                    time.sleep(0.002)  # a slower worker
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        client.pull()
        return evaluate(model, splits.val)

    try:
        accuracies = _threads(2, worker)
        trace = clients[0].trace()
    finally:
        for client in clients:
            if client is not None:
                client.close()
        shards.server.close()
    return accuracies, trace


@pytest.mark.slow
def test_async_converges() -> None:
    accuracies, _ = _train_threads("async", 0, epochs=4)
    assert min(accuracies) >= 0.9


@pytest.mark.slow
def test_ssp_converges_within_its_staleness() -> None:
    accuracies, trace = _train_threads("ssp", 2, epochs=4)
    assert min(accuracies) >= 0.9
    for events in trace:
        assert events, "no recorded answers"
        assert max(e["clock"] - e["min_clock"] for e in events) <= 2


def _train_ps_ranks(rank: int, world: int, optimizer: str) -> dict[str, Any]:
    section = {"strategy": "ps", "ps": {"num_shards": 3}, "large_batch": {"optimizer": optimizer}}
    return train_digits(rank, world, section, epochs=3, lr=0.05 if optimizer == "sgd" else 0.003)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_strategy_ps_trains_on_two_gloo_ranks_without_ray(optimizer: str) -> None:
    results = run_ranks(_train_ps_ranks, optimizer)
    for result in results:
        assert result["accuracy"] >= 0.9
        assert result["replica_spread"] < 1e-6  # sync: every rank holds the same weights
        assert result["summaries"][-1]["time/sync_share"] > 0
    assert not any(result["ray_imported"] for result in results)
