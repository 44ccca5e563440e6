"""The dashboard's human units (durations, sizes) and node names, as plain values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from trainhub.adapters.db import make_engine, migrate
from trainhub.adapters.monitor.node_store import SqlNodeControlStore
from trainhub.core.resources import Node
from trainhub.service.clock import system_clock
from trainhub.service.monitoring import MonitoringService, NodeInventory
from trainhub.web.site import Site, _bytes, _duration
from trainhub.web.trial_parts import node_label, placement_nodes

RAY_ID = "5e1d" * 14  # Ray's node ids are 56 hex characters


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (0, "0 s"),
        (2.345, "2.3 s"),
        (45.4, "45 s"),
        (60, "1 min"),
        (125, "2 min 5 s"),
        (3600, "1 h"),
        (3 * 3600 + 20 * 60 + 7, "3 h 20 min"),
        (2 * 86400 + 4 * 3600, "2 d 4 h"),
        (86400, "1 d"),
    ],
)
def test_durations_read_in_at_most_two_units(seconds: float | None, text: str) -> None:
    assert _duration(seconds) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [(512, "512 B"), (3_670_016, "3.5 MB"), (5 * 1024**3, "5.0 GB"), (3 * 1024**5, "3072.0 TB")],
)
def test_sizes_read_in_binary_units(size: int, text: str) -> None:
    assert _bytes(size) == text


def test_a_node_is_its_hostname_else_the_start_of_its_id() -> None:
    hosts = {RAY_ID: "gpu-07"}
    assert node_label(RAY_ID, hosts) == "gpu-07"
    assert node_label("9" * 56, hosts) == "9" * 12 + "…"
    assert node_label("node-a", hosts) == "node-a"  # short ids stay whole
    nodes = placement_nodes([RAY_ID, RAY_ID, "node-a"], hosts)
    assert nodes == [
        {"id": RAY_ID, "label": "gpu-07", "ranks": 2},
        {"id": "node-a", "label": "node-a", "ranks": 1},
    ]


def test_hostnames_come_from_the_agents_else_from_the_cluster_engine(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    migrate(engine)
    monitoring = MonitoringService(None, SqlNodeControlStore(engine), system_clock)  # agents off
    ray_nodes = [Node(RAY_ID, 0, 8.0, 0, 8.0, hostname="ray-says-07"), Node("n2", 0, 1.0, 0, 1.0)]
    services = SimpleNamespace(monitoring=monitoring, cluster_nodes=lambda: ray_nodes)
    site = Site.__new__(Site)
    site.services = services  # type: ignore[assignment]
    assert site.hostnames() == {RAY_ID: "ray-says-07"}
    inventory = NodeInventory(
        node_id=RAY_ID, hostname="gpu-07", cpu_model="x", num_cores=8, memory_gb=32.0
    )
    monitoring.record([], {RAY_ID: inventory})
    assert site.hostnames() == {RAY_ID: "gpu-07"}
    engine.dispose()
