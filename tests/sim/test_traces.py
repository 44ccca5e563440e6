"""Trace and cluster loaders: small files written here, and the real ones when present."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainhub.sim.cluster import ClusterSpec, load_openb_nodes, load_tiresias_cluster
from trainhub.sim.runner import guarantees_from_demand, load_trace
from trainhub.sim.trace import (
    load_openb_pods,
    load_philly,
    load_pollux_workload,
    load_tiresias,
)

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
needs_shared = pytest.mark.skipif(
    not (SHARED / "pollux-philly" / "philly.csv").exists(),
    reason="the shared traces (../shared/traces) are not on this machine",
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_philly_rows_become_jobs_in_submission_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,t1\n"
        "2017-10-09 06:13:03,2951.0,8,23608.0,t2\n",
    )
    jobs = load_philly(path)
    assert [(j.job_id, j.submit_s, j.num_gpus, j.tenant) for j in jobs] == [
        (0, 0.0, 8, "t2"),
        (1, 2932.0, 1, "t1"),
    ]
    assert jobs[0].request().num_workers == 8
    assert not jobs[0].single_node


def test_pollux_workload_gets_durations_from_the_size_classes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload-1.csv",
        "name,time,application,num_replicas,batch_size\n"
        "cifar10-0,107,cifar10,4,2048\nimagenet-1,110,imagenet,32,6400\n",
    )
    jobs = load_pollux_workload(path)
    assert jobs[0].tenant == "cifar10"
    assert jobs[0].duration_s == pytest.approx(0.5 * 3600 / 4)
    assert jobs[1].submit_s == 3.0
    assert jobs[1].num_gpus == 32


def test_openb_pods_keep_gpu_pods_that_ran(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        "p0,12000,16384,1,460,,LS,Running,0,1000,10\n"
        "p1,6000,12288,0,0,,BE,Running,5,100,5\n"
        "p2,6000,12288,8,1000,,BE,Pending,7,100,\n"
        "p3,4000,12288,2,1000,,BE,Failed,20,400,30\n",
    )
    jobs = load_openb_pods(path)
    assert [(j.num_gpus, j.duration_s, j.tenant, j.single_node) for j in jobs] == [
        (1, 990.0, "LS", True),
        (2, 370.0, "BE", True),
    ]
    assert jobs[1].request().gpus_per_worker == 2
    assert jobs[1].cpus_per_worker == 4.0


def test_openb_pod_list_without_times_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1\n")
    with pytest.raises(ValueError, match="no creation/deletion times"):
        load_openb_pods(path)


def test_tiresias_jobs_and_cluster(tmp_path: Path) -> None:
    jobs = load_tiresias(
        write(
            tmp_path,
            "60_job.csv",
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
            "0,1,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n",
        )
    )
    assert [(j.num_gpus, j.submit_s, j.duration_s) for j in jobs] == [
        (1, 0.0, 164.0),
        (8, 30.0, 147.0),
    ]
    cluster = load_tiresias_cluster(
        write(
            tmp_path,
            "n32g4.csv",
            "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,32,4,40,256",
        )
    )
    assert len(cluster.nodes) == 32
    assert cluster.total_gpus == 128


def test_openb_nodes_carry_gpu_models(tmp_path: Path) -> None:
    cluster = load_openb_nodes(
        write(
            tmp_path,
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1,0,\n"
            "n2,96000,1,8,V100M32\n",
        )
    )
    assert [(n.node_id, n.num_gpus, n.gpu_model) for n in cluster.nodes] == [
        ("n0", 2, "P100"),
        ("n2", 8, "V100M32"),
    ]


def test_guarantees_follow_each_tenants_share_of_gpu_time(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:00:00,300,1,300,small\n"
        "2017-10-09 07:00:01,100,6,600,big\n"
        "2017-10-09 07:00:02,1,1,1,tiny\n",
    )
    shares = guarantees_from_demand(load_philly(path), 16)
    assert {t: s.guaranteed_slots for t, s in shares.items()} == {"big": 10, "small": 5, "tiny": 1}
    assert sum(s.guaranteed_slots for s in shares.values()) == 16


def test_uniform_cluster() -> None:
    cluster = ClusterSpec.uniform(64, 8)
    assert cluster.total_gpus == 512
    assert cluster.nodes[0].node_id == "node-00"
    assert "64 x 8 GPU" in cluster.describe()


def test_unknown_trace_name() -> None:
    with pytest.raises(ValueError, match="unknown trace"):
        load_trace("nope")


@needs_shared
def test_the_real_philly_trace_parses() -> None:
    trace = load_trace("philly", SHARED)
    assert len(trace.jobs) == 82_247
    assert {j.num_gpus for j in trace.jobs} >= {1, 2, 4, 8, 16, 32, 64, 128}
    assert len({j.tenant for j in trace.jobs}) == 15
    assert trace.jobs[0].submit_s == 0.0


@needs_shared
@pytest.mark.parametrize("name", ["pollux-1", "pollux-8"])
def test_the_real_pollux_workloads_parse(name: str) -> None:
    trace = load_trace(name, SHARED)
    assert len(trace.jobs) == 160
    assert all(j.duration_s > 0 for j in trace.jobs)


@needs_shared
@pytest.mark.parametrize("name", ["openb-default", "openb-gpushare100"])
def test_the_real_openb_pod_lists_parse(name: str) -> None:
    trace = load_trace(name, SHARED)
    assert trace.cluster is not None
    assert len(trace.cluster.nodes) == 1213
    assert len(trace.jobs) > 1000
    assert all(j.single_node and j.duration_s > 0 for j in trace.jobs)


@needs_shared
def test_the_real_tiresias_workload_parses() -> None:
    trace = load_trace("tiresias-60", SHARED)
    assert len(trace.jobs) == 60
    assert trace.cluster is not None
    assert trace.cluster.total_gpus == 128
