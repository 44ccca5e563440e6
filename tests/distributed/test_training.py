"""Training on sklearn digits with every strategy on two gloo ranks reaches plain all-reduce's
accuracy. One spawn trains them all in turn (spawning costs seconds on two cores)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed.launch import run_ranks
from tests.distributed.training import train_digits

pytestmark = pytest.mark.slow

VARIANTS: dict[str, dict[str, Any]] = {
    "allreduce": {"strategy": "allreduce"},
    "fp16": {"strategy": "fp16"},
    "bf16": {"strategy": "bf16"},
    "powersgd": {"strategy": "powersgd", "powersgd": {"rank": 2, "start_step": 10}},
    # several buckets in flight: PyTorch's PowerSGD hook could deadlock on gloo (ADR 0004)
    "powersgd-many-buckets": {
        "strategy": "powersgd",
        "bucket_cap_mb": 0.005,
        "powersgd": {"rank": 2, "start_step": 10},
    },
    "onebit": {"strategy": "onebit", "onebit": {"start_step": 10}},
    "topk-many-buckets": {"strategy": "topk", "bucket_cap_mb": 0.005, "topk": {"density": 0.05}},
    "topk": {"strategy": "topk", "topk": {"density": 0.05, "warmup_steps": 20}},
    "localsgd": {"strategy": "localsgd", "localsgd": {"period": 4, "start_step": 10}},
    "localsgd-overlap": {
        "strategy": "localsgd",
        "localsgd": {"period": 4, "start_step": 10, "overlap": True},
    },
    "bf16-autocast+checkpointing": {
        "memory": {"precision": "bf16", "activation_checkpointing": True}
    },
    "fsdp": {"memory": {"fsdp": True}},
    "accumulate-2+linear-warmup": {
        "large_batch": {
            "accumulation_steps": 2,
            "lr_scaling": "linear",
            "reference_batch_size": 64,
            "warmup_steps": 20,
        }
    },
    "lars": {"large_batch": {"optimizer": "lars"}},
    "lamb": {"large_batch": {"optimizer": "lamb"}},
}
LR = {"lamb": 0.01, "lars": 5.0}  # LARS's lr multiplies trust_coefficient (0.001) * ||w||/||g||


def _train_all(rank: int, world: int) -> dict[str, Any]:
    return {
        name: train_digits(rank, world, section, lr=LR.get(name, 0.05))
        for name, section in VARIANTS.items()
    }


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_train_all)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reaches_the_accuracy_of_plain_allreduce(results: list[dict[str, Any]], name: str) -> None:
    baseline = results[0]["allreduce"]["accuracy"]
    got = results[0][name]["accuracy"]
    assert baseline >= 0.9
    assert got >= 0.9, f"{name}: {got:.3f} (all-reduce {baseline:.3f})"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_replicas_end_identical(results: list[dict[str, Any]], name: str) -> None:
    assert results[0][name]["replica_spread"] < 1e-5


def test_compression_sends_fewer_bytes(results: list[dict[str, Any]]) -> None:
    def last_bytes(name: str) -> float:
        return float(results[0][name]["summaries"][-1]["comm/bytes_per_step"])

    dense = last_bytes("allreduce")
    assert dense > 0
    assert last_bytes("fp16") == pytest.approx(dense / 2, rel=0.01)
    assert last_bytes("onebit") < dense / 20
    assert last_bytes("topk") < dense / 5
    assert last_bytes("powersgd") < dense / 2
    # local SGD: only the averaging every 4th step
    assert last_bytes("localsgd") == pytest.approx(dense / 4, rel=0.3)


def test_timer_summaries_are_complete(results: list[dict[str, Any]]) -> None:
    summary = results[0]["allreduce"]["summaries"][-1]
    shares = [v for k, v in summary.items() if k.endswith("_share")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert summary["time/sync_share"] > 0
    assert summary["throughput/samples_per_s"] > 0
    assert summary["time/num_steps"] == 23  # ceil(ceil(1438 / 2) / 32)


def test_linear_scaling_reaches_the_scaled_rate(results: list[dict[str, Any]]) -> None:
    # global batch 32 x 2 ranks x 2 accumulation = 128 = 2 x reference 64
    assert results[0]["accumulate-2+linear-warmup"]["lr"] == pytest.approx(0.1)
