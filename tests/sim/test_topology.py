"""The simulator's racks and blocks (issue 30): the step-time penalty of a gang spanning
wider than it needed, topology-aware placement against plain best fit, the sweep's topology
line, and the co-flow experiment of docs/adr/0046."""

from __future__ import annotations

import pytest

from trainhub.core.scheduling import FairShareConfig, create_policy
from trainhub.core.topology import TopologyNeed
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.coflow import simulate_coflow
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.network import NetworkModel, span_of
from trainhub.sim.sweep import single_rack_rate, topology_line
from trainhub.sim.trace import TraceJob

CLUSTER = ClusterSpec.racks(1, 2, 2, 4)  # 2 racks x 2 nodes x 4 GPUs


def fair() -> object:
    return create_policy("fair", fair=FairShareConfig(preemption=False))


def test_racks_are_labelled_and_spans_read_from_them() -> None:
    labels = {n.node_id: n.labels for n in CLUSTER.nodes}
    assert labels["b0-r1-n00"] == {"block": "b0", "rack": "b0-r1"}
    assert span_of(["b0-r0-n00", "b0-r0-n00"], labels) == "node"
    assert span_of(["b0-r0-n00", "b0-r0-n01"], labels) == "rack"
    assert span_of(["b0-r0-n00", "b0-r1-n01"], labels) == "block"
    assert CLUSTER.domain_gpus("rack") == 8


def test_a_gang_spanning_racks_runs_slower_by_the_model() -> None:
    model = NetworkModel({"node": 800.0, "rack": 200.0, "block": 50.0, "cluster": 25.0}, 0.5)
    assert model.slowdown("rack", "block") == pytest.approx(0.5 + 0.5 * 4)
    # two 1-GPU jobs fill rack 0's first node; plain best fit puts the 8-GPU gang on rack 0's
    # second node and rack 1's first: it spans the block and runs 2.5x as long
    jobs = [
        TraceJob(1, 0.0, 10_000.0, 1),
        TraceJob(2, 0.0, 10_000.0, 1),
        TraceJob(3, 1.0, 1000.0, 8),
    ]
    config = SimConfig(network=model)
    blind = Simulator(jobs, CLUSTER, fair(), config=config).run()  # type: ignore[arg-type]
    gang = next(r for r in blind.records if r.job_id == 3)
    assert (gang.first_start_s, gang.finish_s) == (1.0, 2501.0)
    assert blind.extra["spans"] == {"rack->block": 1}
    # asking for a rack, it takes rack 1 whole and runs at its ideal pace
    need = TopologyNeed("rack", required=True)
    jobs[2] = TraceJob(3, 1.0, 1000.0, 8, topology=need)
    aware = Simulator(jobs, CLUSTER, fair(), config=config).run()  # type: ignore[arg-type]
    gang = next(r for r in aware.records if r.job_id == 3)
    assert (gang.first_start_s, gang.finish_s) == (1.0, 1001.0)
    assert aware.extra["spans"] == {"rack->rack": 1}


def test_topology_aware_placement_keeps_gangs_in_racks_where_best_fit_does_not() -> None:
    # 1-GPU jobs arrive first; best fit fills racks unevenly, then 8-GPU gangs come
    small = [TraceJob(i, float(i), 5000.0, 1) for i in range(4)]
    gangs = [TraceJob(10 + i, 10.0 + i, 500.0, 4) for i in range(2)]
    jobs = small + gangs
    config = SimConfig(network=NetworkModel())
    blind = Simulator(jobs, CLUSTER, fair(), config=config).run()  # type: ignore[arg-type]
    need = TopologyNeed("rack", required=False)
    aware_jobs = [
        TraceJob(j.job_id, j.submit_s, j.duration_s, j.num_gpus, topology=need) for j in jobs
    ]
    aware = Simulator(aware_jobs, CLUSTER, fair(), config=config).run()  # type: ignore[arg-type]
    line = topology_line("t", aware.summary(), blind.summary())
    assert line["avg_jct_vs_topology_blind"] is not None
    assert "fragmentation" in aware.extra
    assert single_rack_rate({"spans": {"rack->rack": 3, "rack->block": 1}}) == 0.75


def test_staggered_sync_phases_keep_two_gangs_at_their_pace_on_a_shared_uplink() -> None:
    alone = simulate_coflow(gangs=1)
    together = simulate_coflow(gangs=2, staggered=False)
    staggered = simulate_coflow(gangs=2, staggered=True)
    assert alone.slowdown == pytest.approx(1.0, abs=0.01)
    assert together.slowdown > 1.2  # each all-reduce at half the link while both send
    assert staggered.slowdown < 1.02
    assert staggered.overlap_share < 0.05 < together.overlap_share


def test_a_tensor_group_waits_for_a_node_that_holds_it_whole() -> None:
    # each node keeps 1 GPU free beside a 3-GPU job: 4 ranks fit one per node, but not as
    # two tensor groups of 2 ranks sharing a node (issue 28): that gang waits for a node
    fillers = [TraceJob(i, 0.0, 1000.0 + i, 3, gpus_per_worker=3) for i in range(4)]
    for tensor, started in ((1, 10.0), (2, 1000.0)):
        gang = TraceJob(9, 10.0, 100.0, 4, tensor=tensor)
        result = Simulator([*fillers, gang], CLUSTER, fair()).run()  # type: ignore[arg-type]
        record = next(r for r in result.records if r.job_id == 9)
        assert record.first_start_s == started, tensor
