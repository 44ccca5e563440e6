"""`trainhub nodes` and cordon/drain/uncordon against a real server with a monitoring service."""

from __future__ import annotations

import pytest

from tests.cli.conftest import Cli, LiveServer
from trainhub.adapters.monitor.node_store import SqlNodeControlStore
from trainhub.core.resources import Node
from trainhub.service.monitoring import GpuSample, MonitoringService, NodeInventory, NodeSample

NODE = "a1b2c3d4e5f6a7b8c9d0"


class OneNode:
    def collect(self) -> list[NodeSample]:
        gpu = GpuSample(
            index=0, uuid="GPU-9", utilization_pct=88.0, memory_used_gb=12.0,
            memory_total_gb=80.0, temperature_c=64.0, power_w=301.0, trial_ids=(7,),
        )  # fmt: skip
        return [NodeSample(node_id=NODE, at=1e9, cpu_pct=40.0, memory_used_gb=20.0,
                           memory_total_gb=256.0, gpus=(gpu,))]  # fmt: skip

    def inventory(self) -> list[NodeInventory]:
        return [
            NodeInventory(
                node_id=NODE, hostname="gpu-07", cpu_model="AMD EPYC 9654", num_cores=192,
                memory_gb=256.0,
                gpus=({"model": "NVIDIA H100", "memory_gb": "80.0", "driver": "550.54",
                       "uuid": "GPU-9"},),
                nics=({"name": "ib0", "speed_mbps": "400000", "address": "10.1.0.7"},),
            )
        ]  # fmt: skip


@pytest.fixture
def monitored(live: LiveServer) -> LiveServer:
    services = live.api.services
    services.cluster_nodes = lambda: [Node(NODE, 1, 192.0, 1, 192.0)]
    engine = services.uow.engine  # type: ignore[attr-defined]
    services.monitoring = MonitoringService(OneNode(), SqlNodeControlStore(engine), lambda: 1e9 + 1)
    services.monitoring.refresh([NODE])
    return live


def test_nodes_lists_hardware_and_live_use(cli: Cli, monitored: LiveServer) -> None:
    result = cli("nodes")
    assert result.exit_code == 0, result.output
    for text in ("a1b2c3d4e5f6", "gpu-07", "AMD EPYC 9654", "192 cores", "NVIDIA H100",
                 "driver 550.54", "64°C", "trial 7", "ib0 10.1.0.7 400000 Mb/s",
                 "1/1 nodes take new trials"):  # fmt: skip
        assert text in result.output, text


def test_nodes_and_cluster_show_the_same_two_memory_figures(
    cli: Cli, monitored: LiveServer
) -> None:
    """The host's memory (its agent: 256 GB) and what trials may reserve of it (Ray's
    ``memory`` resource: 180 GB here), named alike in both commands."""
    services = monitored.api.services
    services.cluster_nodes = lambda: [
        Node(NODE, 1, 192.0, 1, 192.0, total_memory_gb=180.0, free_memory_gb=180.0)
    ]
    nodes = cli("nodes")
    assert nodes.exit_code == 0, nodes.output
    assert "256.0 GB host" in nodes.output
    assert "180.0 GB for trials" in nodes.output
    cluster = cli("cluster")
    assert cluster.exit_code == 0, cluster.output
    assert "180.0 / 256.0" in cluster.output
    assert "for trials/host" in cluster.output
    assert "gpu-07" in cluster.output  # the hostname, not the node id


def test_admins_cordon_drain_and_uncordon_by_hostname(cli: Cli, monitored: LiveServer) -> None:
    result = cli("nodes", "drain", "gpu-07", "--reason", "PSU swap")
    assert result.exit_code == 0, result.output
    assert "draining" in result.output
    listing = cli("nodes").output
    assert "PSU swap" in listing
    assert "0/1 nodes take new trials" in listing
    assert "ok" in cli("nodes", "uncordon", "a1b2c3").output
    missing = cli("nodes", "cordon", "nowhere")
    assert missing.exit_code != 0
    assert "no node 'nowhere'" in missing.output


def test_members_may_not_cordon(cli: Cli, monitored: LiveServer) -> None:
    member = monitored.api.user("bob", "default")
    result = cli("nodes", "cordon", "gpu-07", token=member)
    assert result.exit_code != 0
    assert "admin" in result.output.lower()


def test_history_lists_health_changes(cli: Cli, monitored: LiveServer) -> None:
    result = cli("nodes", "history", "gpu-07")
    assert result.exit_code == 0, result.output
    assert "healthy" in result.output
    assert "2001-09-09 01:46:41" in result.output  # the fake clock's 1e9 + 1
