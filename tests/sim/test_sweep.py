"""Sweep windows at a chosen load, the sweep's line keys, and the simulator's new measures."""

from __future__ import annotations

import math

import pytest

from trainhub.core.scheduling import FifoPolicy, TenantShare
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import Simulator
from trainhub.sim.runner import simulate
from trainhub.sim.sweep import LINE_KEYS, cell_lines, cell_name, load_window, offered_load
from trainhub.sim.trace import TraceJob


def job(i: int, at: float, duration: float, gpus: int = 1, tenant: str = "t") -> TraceJob:
    return TraceJob(job_id=i, submit_s=at, duration_s=duration, num_gpus=gpus, tenant=tenant)


def test_offered_load_is_mean_occupancy_while_jobs_arrive() -> None:
    # two 1-GPU jobs over a 100 s span: one runs 50 s, one (the last) starts at the end
    jobs = [job(0, 0.0, 50.0), job(1, 100.0, 1000.0)]
    assert offered_load(jobs, 1) == pytest.approx(0.5)
    # a job that runs for weeks counts only while the others arrive
    assert offered_load([job(0, 0.0, 1e9), job(1, 100.0, 1.0)], 4) == pytest.approx(0.25)


@pytest.mark.parametrize("load", [0.7, 1.0, 1.5])
def test_a_window_is_rescaled_to_the_load_asked_for(load: float) -> None:
    trace = [job(i, i * 37.0, 100.0 + (i * 53) % 900, gpus=1 + i % 3) for i in range(400)]
    window = load_window(trace, 32, load, 200, start_fraction=0.25)
    assert len(window) == 200
    assert [j.job_id for j in window] == list(range(200))
    assert window[0].submit_s == 0.0
    assert offered_load(window, 32) == pytest.approx(load, rel=1e-3)
    # same jobs, same order; only the pace changed
    assert [j.duration_s for j in window] == [j.duration_s for j in trace[100:300]]


def test_a_window_too_small_for_the_load_is_refused() -> None:
    trace = [job(i, float(i), 10.0) for i in range(10)]
    with pytest.raises(ValueError, match="larger window"):
        load_window(trace, 100, 1.5, 10)


def test_idle_while_fits_counts_gpus_a_waiting_trial_could_have_used() -> None:
    # FIFO on one 8-GPU node: A holds 4 GPUs until 1000; B (8 GPUs) blocks the queue; C (1 GPU)
    # would fit on the 4 idle GPUs from 10 to 1000 but waits behind B
    jobs = [job(0, 0.0, 1000.0, gpus=4), job(1, 0.0, 100.0, gpus=8), job(2, 10.0, 100.0)]
    summary = Simulator(jobs, ClusterSpec.uniform(1, 8), FifoPolicy()).run().summary()
    # C's one GPU for 990 s, over 8 GPUs for the 1,200 s from the first arrival to the end
    assert summary["idle_while_fits"] == pytest.approx(990.0 / (8 * 1200.0))
    assert summary["preemptions_per_job"] == 0.0
    # arrivals span 10 s, all of it with A's 4 GPUs held
    assert summary["utilisation_while_arriving"] == pytest.approx(0.5)


def test_memory_per_worker_limits_a_simulated_node() -> None:
    # two pods of 1 GPU and 200 GB on one 8-GPU, 300 GB node: the second waits for memory
    jobs = [
        TraceJob(i, 0.0, 100.0, 1, memory_gb_per_worker=200.0, single_node=True) for i in (0, 1)
    ]
    cluster = ClusterSpec.uniform(1, 8, cpus_per_node=8.0, memory_gb_per_node=300.0)
    result = simulate(jobs, cluster, "fifo", tenants={"default": TenantShare(8)})
    assert sorted(r.finish_s for r in result.records) == [100.0, 200.0]


def test_cell_lines_have_the_benchmark_keys_and_ratios_against_fifo() -> None:
    base = {
        "avg_jct_s": 100.0,
        "p99_jct_s": 400.0,
        "avg_queueing_s": 60.0,
        "fairness_min_ratio": 0.5,
        "idle_while_fits": 0.1,
        "utilisation_while_arriving": 0.9,
        "preemptions_per_job": 0.0,
        "wall_s": 1.0,
    }
    fair = dict(base, policy="fair", avg_jct_s=40.0, p99_jct_s=400.0, fairness_min_ratio=0.99)
    lines = cell_lines(cell_name("philly", 48, 8, 1.0), [dict(base, policy="fifo"), fair])
    assert [tuple(line) for line in lines] == [LINE_KEYS, LINE_KEYS]
    assert lines[1]["cell"] == "philly-48x8-load1.0"
    assert lines[1]["avg_jct_vs_fifo"] == pytest.approx(0.4)
    assert lines[1]["p99_jct_vs_fifo"] == pytest.approx(1.0)
    # FIFO's jobs waited 60% of their completion time: it queues
    assert lines[1]["fifo_queues"] is True
    nan = cell_lines("x", [dict(fair, avg_jct_s=math.nan)])[0]
    assert nan["avg_jct_vs_fifo"] is None
    assert nan["fifo_queues"] is False


def test_cell_lines_against_las_per_tenant_and_by_slowdown() -> None:
    """Issue 27's keys: LAS as the reference, tenants within their guarantee, each tenant
    weighing the same, p99 slowdown."""
    base = {
        "avg_queueing_s": 50.0,
        "fairness_min_ratio": 1.0,
        "idle_while_fits": 0.0,
        "utilisation_while_arriving": 0.9,
        "preemptions_per_job": 0.0,
        "wall_s": 1.0,
        "p99_jct_s": 500.0,
    }
    fifo = dict(
        base,
        policy="fifo",
        avg_jct_s=100.0,
        p99_slowdown=10.0,
        # x holds 1 job of 100 s on average, y 9 of 100 s; only x stayed within its guarantee
        tenant_avg_jct_s={"x": 100.0, "y": 100.0},
        within_guarantee=["x"],
    )
    las = dict(fifo, policy="las", avg_jct_s=50.0, p99_slowdown=2.0, within_guarantee=[])
    fair = dict(
        fifo,
        policy="fair",
        avg_jct_s=60.0,
        p99_slowdown=5.0,
        tenant_avg_jct_s={"x": 120.0, "y": 40.0},
        within_guarantee=["x", "y"],
    )
    lines = {line["policy"]: line for line in cell_lines("c", [fifo, las, fair], split="test")}
    line = lines["fair"]
    assert line["split"] == "test"
    assert line["fifo_wait_share"] == pytest.approx(0.5)
    assert line["avg_jct_vs_las"] == pytest.approx(1.2)
    assert line["las_avg_jct_vs_fifo"] == pytest.approx(0.5)
    assert lines["fifo"]["las_avg_jct_vs_fifo"] == pytest.approx(0.5)
    assert line["p99_slowdown_vs_fifo"] == pytest.approx(0.5)
    # x and y were within their guarantee in fair's run: the worst of them, x, is 1.2x
    assert line["within_guarantee_jct_vs_fifo"] == pytest.approx(1.2)
    # each tenant weighs the same: (120 + 40) / 2 against 100
    assert line["tenant_weighted_jct_vs_fifo"] == pytest.approx(0.8)
    # without LAS in the run, the LAS ratios are null; without a tenant within its
    # guarantee, so is that ratio
    alone = cell_lines("c", [dict(fifo, within_guarantee=[]), dict(fair, within_guarantee=[])])
    assert alone[1]["avg_jct_vs_las"] is None
    assert alone[1]["within_guarantee_jct_vs_fifo"] is None


def test_a_tenant_within_its_guarantee_is_found_by_its_peak_demand() -> None:
    # x (guarantee 2) asks for 2 GPUs at most; y (guarantee 2) for 3 at once
    jobs = [
        TraceJob(0, 0.0, 100.0, 2, "x"),
        TraceJob(1, 0.0, 100.0, 2, "y"),
        TraceJob(2, 10.0, 100.0, 1, "y"),
    ]
    tenants = {"x": TenantShare(2), "y": TenantShare(2)}
    summary = Simulator(jobs, ClusterSpec.uniform(1, 8), FifoPolicy(), tenants).run().summary()
    assert summary["within_guarantee"] == ["x"]
    assert summary["tenant_avg_jct_s"] == {"x": 100.0, "y": 100.0}
    assert summary["p99_slowdown"] == pytest.approx(1.0)
