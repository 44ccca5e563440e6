"""Parameter server: consistency models on the bare shard, then through Ray actors.

The shard tests drive :class:`ParameterShard` with asyncio directly (workers are coroutines with
chosen speeds). The Ray tests use the session's local Ray head (``ray_address``); workers are
threads of this process, each with its own model and client, like ranks would be.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
from collections.abc import Iterator
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
from trainhub.runtime.distributed.ps.client import connect_parameter_server, shard_bounds
from trainhub.runtime.distributed.ps.optimizer import ParameterServerOptimizer
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


# --- through Ray ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session(ray_address: str) -> Iterator[str]:
    import ray

    from trainhub.runtime.distributed.ps import actors

    actors.ensure_ray(ray_address)
    yield ray_address
    if ray.is_initialized():
        ray.shutdown()


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


@pytest.mark.ray
def test_sync_equals_sgd_on_the_combined_batch(ray_session: str) -> None:
    torch.manual_seed(0)
    template = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))]
    batches *= 4
    config = ParameterServerConfig(num_shards=3, consistency="sync")
    name = f"test-sync-{os.getpid()}-{time.monotonic_ns()}"
    clients: list[Any] = [None, None]
    created = threading.Event()

    def worker(rank: int) -> torch.Tensor:
        model = copy.deepcopy(template)
        if rank == 1:
            created.wait(60)
            with torch.no_grad():  # start elsewhere: the initial pull must overwrite this
                for p in model.parameters():
                    p.add_(1.0)
        client = connect_parameter_server(model, config, name=name, rank=rank, world_size=2)
        if rank == 0:
            created.set()
        clients[rank] = client
        opt = ParameterServerOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), client
        )
        for x, y in batches:
            half = slice(rank * 4, rank * 4 + 4)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[half]), y[half]).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    got = _threads(2, worker)
    reference = copy.deepcopy(template)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    expected = torch.cat([p.detach().flatten() for p in reference.parameters()])
    for weights in got:
        torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    assert clients[0].meter.snapshot().payload_bytes == 4 * 2 * 4 * expected.numel()
    clients[0].close()


def _train_threads(consistency: str, staleness: int, epochs: int) -> tuple[list[float], Any]:
    splits = data.load("digits")
    config = ParameterServerConfig(num_shards=2, consistency=consistency, staleness=staleness)
    name = f"test-{consistency}-{os.getpid()}-{time.monotonic_ns()}"
    created = threading.Event()
    clients: list[Any] = [None, None]

    def worker(rank: int) -> float:
        torch.manual_seed(0)
        model = models.create("mlp", in_features=64, hidden=(64,))
        if rank == 1:
            created.wait(60)
        client = connect_parameter_server(model, config, name=name, rank=rank, world_size=2)
        clients[rank] = client
        created.set()
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

    accuracies = _threads(2, worker)
    trace = clients[0].trace()
    clients[0].close()
    return accuracies, trace


@pytest.mark.ray
@pytest.mark.slow
def test_async_converges(ray_session: str) -> None:
    accuracies, _ = _train_threads("async", 0, epochs=4)
    assert min(accuracies) >= 0.9


@pytest.mark.ray
@pytest.mark.slow
def test_ssp_converges_within_its_staleness(ray_session: str) -> None:
    accuracies, trace = _train_threads("ssp", 2, epochs=4)
    assert min(accuracies) >= 0.9
    for events in trace:
        assert events, "no recorded answers"
        assert max(e["clock"] - e["min_clock"] for e in events) <= 2


def _train_ps_ranks(rank: int, world: int, address: str) -> dict[str, Any]:
    os.environ["RAY_ADDRESS"] = address
    result = train_digits(
        rank,
        world,
        {"strategy": "ps", "ps": {"num_shards": 2}},
        epochs=3,
        ps_name=f"ranks-{address.rsplit(':', maxsplit=1)[-1]}",
    )
    import ray

    ray.shutdown()
    return result


@pytest.mark.ray
@pytest.mark.slow
def test_strategy_ps_trains_on_two_gloo_ranks(ray_address: str) -> None:
    results = run_ranks(_train_ps_ranks, ray_address)
    for result in results:
        assert result["accuracy"] >= 0.9
        assert result["replica_spread"] < 1e-6  # sync: every rank holds the same weights
        assert result["summaries"][-1]["time/sync_share"] > 0
