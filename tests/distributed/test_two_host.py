"""A 2-worker trial spread over two "hosts": network namespaces joined by a 1 Gbit/s veth link,
a Ray head in one and a Ray worker node in the other, gloo DDP across them."""

from __future__ import annotations

import json

import pytest

from tests.distributed.netns import HEAD_IP, WORKER_IP, two_host_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REASON = unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"two-host test: {REASON}")
def test_a_spread_trial_trains_across_two_hosts() -> None:
    jobs = [
        {
            "name": "digits/topk",
            "model": "mlp",
            "model_kwargs": {"in_features": 64, "hidden": [64]},
            "dataset": "digits",
            "epochs": 4,
            "batch_size": 32,
            "distributed": {"strategy": "topk", "topk": {"density": 0.1, "warmup_steps": 10}},
        }
    ]
    with two_host_cluster(rate="1gbit") as cluster:
        lines = cluster.run_driver(
            ["-m", "tests.distributed.two_host", "--jobs", json.dumps(jobs)], timeout_s=300
        )
    placed = next(line for line in lines if line["event"] == "placed")
    assert sorted(placed["nodes"]) == [HEAD_IP, WORKER_IP]  # one rank per host
    result = next(line for line in lines if line["event"] == "result")
    assert result["accuracy"] >= 0.9
    last_epoch = result["epochs"][-1]  # type: ignore[index]
    assert last_epoch["comm/bytes_per_step"] > 0
