"""The step timer's accounting, and the mixed-precision object (single process)."""

from __future__ import annotations

import time

import pytest
import torch

from trainhub.runtime.distributed.comm_meter import CommMeter, ring_allreduce_wire_bytes
from trainhub.runtime.distributed.memory import MixedPrecision
from trainhub.runtime.distributed.timing import StepTimer


def test_phases_and_sync_add_up() -> None:
    # sleeps long enough that a loaded machine's scheduling delays (a few ms) stay small
    # against them
    meter = CommMeter()
    timer = StepTimer(meter=meter, report_every_steps=2)
    for _ in range(2):
        for _ in timer.iter_data([1]):
            with timer.phase("forward"):
                time.sleep(0.04)
            with timer.phase("backward"):
                time.sleep(0.04)
                meter.mark_gradients_ready()  # the last bucket's hook ran...
                meter.add_allreduce(1000, 2)
                time.sleep(0.08)  # ...and backward waits for the collective
            with timer.phase("optimizer"), meter.sync():  # e.g. model averaging
                time.sleep(0.04)
            timer.end_step(num_samples=8)
    assert timer.should_report()
    summary = timer.summary()
    assert summary["time/sync_share"] == pytest.approx(0.6, abs=0.1)
    assert summary["time/forward_share"] == pytest.approx(0.2, abs=0.07)
    assert summary["time/optimizer_share"] < 0.05
    shares = [v for k, v in summary.items() if k.endswith("_share")]
    assert sum(shares) == pytest.approx(1.0)
    assert summary["comm/payload_bytes_per_step"] == 1000
    assert summary["comm/bytes_per_step"] == ring_allreduce_wire_bytes(1000, 2) == 1000
    assert summary["throughput/samples_per_s"] == pytest.approx(8 / summary["time/step_s"])
    assert timer.summary() == {}  # reset


def test_unknown_phase() -> None:
    with pytest.raises(ValueError, match="phase must be one of"), StepTimer().phase("eval"):
        pass


def test_bf16_autocast_on_cpu() -> None:
    precision = MixedPrecision("bf16", torch.device("cpu"))
    layer = torch.nn.Linear(4, 4)
    with precision.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    precision.backward(out.float().sum())
    assert layer.weight.grad is not None
    assert layer.weight.grad.dtype == torch.float32


def test_fp16_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="'fp16' needs a GPU"):
        MixedPrecision("fp16", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fp16_scaler_on_gpu() -> None:
    precision = MixedPrecision("fp16", torch.device("cuda"))
    layer = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    with precision.autocast():
        loss = layer(torch.randn(2, 4, device="cuda")).float().sum()
    precision.backward(loss)
    precision.step(opt)
    assert precision.scaler is not None
    assert precision.state_dict()["scale"] > 0


def test_pipeline_bubble_and_tensor_comm_are_phases_of_their_own() -> None:
    from torch import nn

    from trainhub.core.step_timing import step_timing
    from trainhub.distributed_contract import DistributedSpec
    from trainhub.runtime.distributed.parallel import parallelize

    # one process: a ParallelModel whose times the pipeline and DTensor would advance
    par = parallelize(nn.Linear(2, 2), DistributedSpec(), device="cpu", loss_fn=nn.MSELoss())
    timer = StepTimer(parallel=par)
    with timer.phase("forward"):
        time.sleep(0.2)
        par.times.step_s += 0.2
        par.times.compute_s += 0.1  # so 0.1 s idle: the bubble
        par.times.tp_comm_s += 0.05
    timer.end_step(num_samples=4)
    summary = timer.summary()
    assert summary["time/bubble_share"] == pytest.approx(0.5, abs=0.15)
    assert summary["time/tp_comm_share"] == pytest.approx(0.25, abs=0.1)
    assert summary["time/forward_share"] == pytest.approx(0.25, abs=0.15)
    assert sum(v for k, v in summary.items() if k.endswith("_share")) == pytest.approx(1.0)
    timing = step_timing(summary)  # what `trainhub show` and the trial page list
    assert timing is not None
    assert {"bubble", "tp_comm"} <= {phase.name for phase in timing.phases}
