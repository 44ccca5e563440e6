"""CPU-only clusters (a laptop, CI): slots are CPU cores and nothing may wait for GPUs."""

from __future__ import annotations

import pytest

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import Pending, QueuedTrial, Snapshot, Start
from trainhub.core.scheduling.factory import create_policy
from trainhub.core.scheduling.snapshot import TenantShare


@pytest.mark.parametrize("name", ["fifo", "fair", "sjf", "las"])
def test_cpu_requests_start_on_free_cpus_and_the_rest_wait_with_a_reason(name: str) -> None:
    nodes = (Node("laptop", 0, 8.0, 0, 8.0),)
    queue = (
        QueuedTrial(1, "t", ResourceRequest(2, cpus_per_worker=1.0), submitted_at=1.0),
        QueuedTrial(2, "t", ResourceRequest(8, cpus_per_worker=1.0), submitted_at=2.0),
    )
    decisions = {
        d.trial_id: d
        for d in create_policy(name).decide(
            Snapshot(10.0, nodes, queue, (), {"t": TenantShare()}, {})
        )
    }
    first, second = decisions[1], decisions[2]
    assert isinstance(first, Start)
    assert first.placement == ("laptop", "laptop")
    assert isinstance(second, Pending)
    assert "6 CPUs free" in second.reason
