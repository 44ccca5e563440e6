"""The agents on a real Ray instance: one per node, pulled without blocking the loop."""

from __future__ import annotations

import time

import pytest

from trainhub.adapters.monitor.agent import RayNodeMonitor
from trainhub.service.monitoring import NodeInventory, NodeSample

pytestmark = pytest.mark.ray


def test_an_agent_per_node_reports_samples_and_inventory(ray_address: str) -> None:
    from tests.fixtures.ray_cluster import TEST_NAMESPACE

    monitor = RayNodeMonitor(ray_address, TEST_NAMESPACE, interval_s=0.5)
    samples: list[NodeSample] = monitor.collect()  # connects and creates the agents
    inventory: list[NodeInventory] = []
    deadline = time.monotonic() + 60
    while (not samples or not inventory) and time.monotonic() < deadline:
        started = time.monotonic()
        samples += monitor.collect()
        inventory += monitor.inventory()
        assert time.monotonic() - started < 1.0  # a pull never waits for an agent
        time.sleep(0.3)
    assert samples, "no sample within 60 s"
    import ray

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
    assert {s.node_id for s in samples} <= nodes
    assert inventory[0].node_id in nodes
    assert inventory[0].num_cores > 0
