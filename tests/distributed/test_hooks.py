"""Each DDP communication strategy on two real gloo ranks, against plain all-reduce.

One spawn runs every strategy (spawning costs seconds on two cores); the tests below check what
the ranks recorded. The model has a single weight tensor so that a bucket's flat residual lines
up with ``weight.grad``; multi-tensor buckets are covered by the unit tests of the compressors
and by the training tests.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.distributed.launch import run_ranks
from trainhub.runtime.distributed.comm_meter import CommMeter
from trainhub.runtime.distributed.config import DistributedConfig
from trainhub.runtime.distributed.strategies import make_comm_hook

NUM_STEPS = 4
IN, OUT = 64, 32  # 2048 weights: one bucket


def _config(strategy: str) -> DistributedConfig:
    return DistributedConfig.from_mapping(
        {
            "strategy": strategy,
            "powersgd": {"rank": 2, "start_step": 2},
            "onebit": {"start_step": 1},
            "topk": {"density": 0.05, "warmup_steps": 0, "start_step": 1},
            "localsgd": {"start_step": 1, "period": 2},
        }
    )


def _residual(strategy: str, state: Any) -> torch.Tensor | None:
    if strategy in ("onebit", "topk"):
        found = state.residuals.get(0)
    elif strategy == "powersgd":
        found = state.state.error_dict.get(0)
    else:
        return None
    return None if found is None else found.detach().clone()


def _gather_mean(t: torch.Tensor, world: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.stack(parts).mean(0)


def _run_strategy(rank: int, world: int, strategy: str) -> dict[str, Any]:
    torch.manual_seed(0)
    local = nn.Linear(IN, OUT, bias=False)
    ddp_model = copy.deepcopy(local)
    ddp = DistributedDataParallel(ddp_model, bucket_cap_mb=25.0, gradient_as_bucket_view=True)
    meter = CommMeter()
    state, hook = make_comm_hook(_config(strategy), meter, None)
    ddp.register_comm_hook(state, hook)
    gen = torch.Generator().manual_seed(100 + rank)
    steps = []
    for _ in range(NUM_STEPS):
        x = torch.randn(16, IN, generator=gen)
        residual_before = _residual(strategy, state)
        local.load_state_dict(ddp_model.state_dict())
        local.zero_grad()
        (local(x) ** 2).mean().backward()
        assert local.weight.grad is not None
        own = local.weight.grad.detach().clone()
        ddp.zero_grad()
        bytes_before = meter.snapshot().payload_bytes
        (ddp(x) ** 2).mean().backward()
        assert ddp_model.weight.grad is not None
        got = ddp_model.weight.grad.detach().clone()
        residual_after = _residual(strategy, state)
        steps.append(
            {
                "own": own.flatten(),
                "true_mean": _gather_mean(own, world).flatten(),
                "got": got.flatten(),
                "residual_before": residual_before,
                "residual_after": residual_after,
                "mean_residual_after": None
                if residual_after is None
                else _gather_mean(residual_after, world),
                "mean_input": _gather_mean(
                    own.flatten() + (residual_before if residual_before is not None else 0), world
                ),
                "payload_bytes": meter.snapshot().payload_bytes - bytes_before,
            }
        )
        with torch.no_grad():
            ddp_model.weight.sub_(0.05 * ddp_model.weight.grad)
    return {"steps": steps}


def _run_all(rank: int, world: int) -> dict[str, Any]:
    results: dict[str, Any] = {
        s: _run_strategy(rank, world, s)
        for s in ("allreduce", "fp16", "bf16", "powersgd", "onebit", "topk", "localsgd")
    }
    results["combined_batch"] = _ddp_equals_combined_batch(rank, world)
    results["half_allreduce"] = _half_allreduce(rank, world)
    return results


def _ddp_equals_combined_batch(rank: int, world: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(7)  # same stream on both ranks: the combined batch
    for _ in range(3):
        x, y = (
            torch.randn(8 * world, 10, generator=gen),
            torch.randint(0, 3, (8 * world,), generator=gen),
        )
        shard = slice(rank * 8, (rank + 1) * 8)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x[shard]), y[shard]).backward()
        opt.step()
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    return {
        "ddp": torch.cat([p.detach().flatten() for p in model.parameters()]),
        "single": torch.cat([p.detach().flatten() for p in reference.parameters()]),
    }


@pytest.fixture(scope="module")
def recorded() -> list[dict[str, Any]]:
    return run_ranks(_run_all)


def _steps(recorded: list[dict[str, Any]], strategy: str) -> list[list[dict[str, Any]]]:
    return [r[strategy]["steps"] for r in recorded]


def test_allreduce_is_the_mean_of_the_ranks_gradients(recorded: list[dict[str, Any]]) -> None:
    for rank_steps in _steps(recorded, "allreduce"):
        for step in rank_steps:
            torch.testing.assert_close(step["got"], step["true_mean"], rtol=1e-6, atol=1e-7)
            assert step["payload_bytes"] == IN * OUT * 4


@pytest.mark.parametrize(("strategy", "rel"), [("fp16", 2.0**-9), ("bf16", 2.0**-6)])
def test_half_precision_wire_is_within_rounding(
    recorded: list[dict[str, Any]], strategy: str, rel: float
) -> None:
    # two roundings (cast, sum) of 2^-11 (fp16) or 2^-8 (bf16) each, relative to the largest entry
    for rank_steps in _steps(recorded, strategy):
        for step in rank_steps:
            scale = step["true_mean"].abs().max().item()
            assert (step["got"] - step["true_mean"]).abs().max().item() <= rel * scale
            peak = 4 if strategy == "fp16" else 0  # fp16: the ranks agree on the largest entry
            assert step["payload_bytes"] == IN * OUT * 2 + peak


def test_powersgd_error_feedback_carries_the_approximation_error(
    recorded: list[dict[str, Any]],
) -> None:
    for rank_steps in _steps(recorded, "powersgd"):
        for i, step in enumerate(rank_steps):
            if i < 2:  # start_step: plain all-reduce
                torch.testing.assert_close(step["got"], step["true_mean"], rtol=1e-6, atol=1e-7)
                continue
            # each rank keeps (its input) - (shared approximation): the mean of what was sent
            # plus the mean residual is the mean input
            torch.testing.assert_close(
                step["got"] + step["mean_residual_after"], step["mean_input"], rtol=1e-5, atol=1e-6
            )
            assert step["payload_bytes"] == (IN + OUT) * 2 * 4  # P and Q of rank 2


def test_onebit_sends_scaled_signs_and_keeps_the_rest(recorded: list[dict[str, Any]]) -> None:
    steps_by_rank = _steps(recorded, "onebit")
    for rank_steps in steps_by_rank:
        torch.testing.assert_close(
            rank_steps[0]["got"], rank_steps[0]["true_mean"], rtol=1e-6, atol=1e-7
        )
        for step in rank_steps[1:]:
            x = step["own"] + (
                step["residual_before"] if step["residual_before"] is not None else 0
            )
            block = 256  # the default block_size: one scale per 256 entries
            scales = x.view(-1, block).abs().mean(1).repeat_interleave(block)
            sent = torch.where(x >= 0, 1.0, -1.0) * scales
            # residual + sent == input (float rounding of one subtraction only)
            torch.testing.assert_close(step["residual_after"] + sent, x, rtol=0, atol=1e-7)
            assert step["residual_after"].norm() <= x.norm()  # the compressor is contractive
            torch.testing.assert_close(
                step["got"] + step["mean_residual_after"], step["mean_input"], rtol=1e-5, atol=1e-7
            )
            assert step["payload_bytes"] == IN * OUT // 8 + 4 * IN * OUT // block  # signs, scales


def test_topk_residual_plus_sent_is_exactly_the_input(recorded: list[dict[str, Any]]) -> None:
    k = math.ceil(0.05 * IN * OUT)
    for rank_steps in _steps(recorded, "topk"):
        torch.testing.assert_close(
            rank_steps[0]["got"], rank_steps[0]["true_mean"], rtol=1e-6, atol=1e-7
        )
        for step in rank_steps[1:]:
            x = step["own"] + (
                step["residual_before"] if step["residual_before"] is not None else 0
            )
            residual = step["residual_after"]
            sent_mask = residual == 0
            assert int(sent_mask.sum()) >= k
            kept = ~sent_mask
            assert torch.equal(residual[kept], x[kept])  # bitwise: unsent entries kept as they are
            sent = torch.where(sent_mask, x, torch.zeros_like(x))
            assert torch.equal(residual + sent, x)
            # what was sent are the largest entries
            assert x[kept].abs().max() <= x[sent_mask].abs().min() + 1e-12
            torch.testing.assert_close(
                step["got"] + step["mean_residual_after"], step["mean_input"], rtol=1e-5, atol=1e-7
            )
            assert step["payload_bytes"] == 2 * k * 4


def test_localsgd_stops_gradient_communication_after_start(recorded: list[dict[str, Any]]) -> None:
    for rank_steps in _steps(recorded, "localsgd"):
        torch.testing.assert_close(rank_steps[0]["got"], rank_steps[0]["true_mean"])
        for step in rank_steps[1:]:
            assert torch.equal(step["got"], step["own"])
            assert step["payload_bytes"] == 0


def test_ddp_equals_one_process_on_the_combined_batch(recorded: list[dict[str, Any]]) -> None:
    for result in recorded:
        got = result["combined_batch"]
        torch.testing.assert_close(got["ddp"], got["single"], rtol=1e-5, atol=1e-6)


def test_gloo_sums_half_precision_types(recorded: list[dict[str, Any]]) -> None:
    # fp16 / bf16 strategies rely on gloo reducing these dtypes (old releases could not)
    for result in recorded:
        assert result["half_allreduce"] == {"float16": 3.0, "bfloat16": 3.0}


def _half_allreduce(rank: int, world: int) -> dict[str, float]:
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.full((5,), float(rank + 1), dtype=dtype)
        dist.all_reduce(t)
        out[str(dtype).removeprefix("torch.")] = float(t[0])
    return out
