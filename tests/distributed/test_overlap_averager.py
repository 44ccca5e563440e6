"""Overlap local SGD on two real gloo ranks: the averaging lands one period late, exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.launch import run_ranks
from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.overlap_averager import OverlappedAverager

pytestmark = pytest.mark.slow


def _params(rank: int) -> list[torch.nn.Parameter]:
    # two dtypes: each gets its own flat bucket
    params = [
        torch.nn.Parameter(torch.full((3, 2), float(rank + 1))),
        torch.nn.Parameter(torch.arange(4, dtype=torch.float64) * (rank + 1)),
    ]
    for p in params:
        p.grad = torch.zeros_like(p)  # averagers skip parameters without gradients
    return params


def _overlap(rank: int, world: int) -> dict[str, Any]:
    meter = CommMeter()
    averager = OverlappedAverager(period=2, warmup_steps=1, meter=meter)
    params = _params(rank)
    seen: dict[str, Any] = {"start": [p.detach().clone() for p in params]}
    averager.average_parameters(params)  # step 0: before warm-up, nothing
    seen["in_flight_after_step0"] = averager.in_flight
    averager.average_parameters(params)  # step 1: snapshot s and start averaging it
    seen["in_flight_after_step1"] = averager.in_flight
    seen["unchanged_after_start"] = [p.detach().clone() for p in params]
    with torch.no_grad():  # a local step after the snapshot: each rank moves differently
        for p in params:
            p.add_(10.0 * (rank + 1))
    seen["local"] = [p.detach().clone() for p in params]
    averager.average_parameters(params)  # step 2: no averaging step, nothing applied
    seen["after_step2"] = [p.detach().clone() for p in params]
    averager.average_parameters(params)  # step 3: apply mean(s) - s, start the next one
    seen["after_step3"] = [p.detach().clone() for p in params]
    averager.flush()
    seen["after_flush"] = [p.detach().clone() for p in params]
    seen["payload_bytes"] = meter.snapshot().payload_bytes
    return seen


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_overlap)


def test_averaging_starts_at_the_first_averaging_step_and_leaves_parameters_alone(
    ranks: list[dict[str, Any]],
) -> None:
    for seen in ranks:
        assert not seen["in_flight_after_step0"]
        assert seen["in_flight_after_step1"]
        for start, now in zip(seen["start"], seen["unchanged_after_start"], strict=True):
            assert torch.equal(start, now)
        for local, now in zip(seen["local"], seen["after_step2"], strict=True):
            assert torch.equal(local, now)


def test_correction_is_the_snapshots_mean_minus_the_own_snapshot(
    ranks: list[dict[str, Any]],
) -> None:
    mean_start = [(a + b) / 2 for a, b in zip(ranks[0]["start"], ranks[1]["start"], strict=True)]
    for seen in ranks:
        for start, local, got, mean in zip(
            seen["start"], seen["local"], seen["after_step3"], mean_start, strict=True
        ):
            # local progress since the snapshot is kept; the snapshot part is averaged
            torch.testing.assert_close(got, mean + (local - start))


def test_flush_makes_the_replicas_agree_after_the_last_period(
    ranks: list[dict[str, Any]],
) -> None:
    # nothing moved between step 3 and the flush: the replicas become identical
    for a, b in zip(ranks[0]["after_flush"], ranks[1]["after_flush"], strict=True):
        torch.testing.assert_close(a, b)
    # two averagings of 6 fp32 + 4 fp64 entries
    assert ranks[0]["payload_bytes"] == 2 * (6 * 4 + 4 * 8)
