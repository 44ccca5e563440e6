"""The control loop keeps each attempt's network bytes (issue 30, ADR 0045): two tenants'
trials on one node attributed apart, summed per tenant, user and project per day in the usage
report and CSV, on the trial's detail, and in /metrics' counter (real SQLite, a fake
executor whose ranks report their namespaces' counters as rank actors do)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.traffic import Counters, NamespaceSample
from trainhub.service.experiments import ExperimentService
from trainhub.service.usage import UsageService, usage_csv

SPEC = "name: n\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 1}\n"
MiB = 1024**2


@pytest.fixture
def h(tmp_path: Path) -> Iterator[LoopHarness]:
    harness = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(1))  # both trials on one node
    for name in ("blue", "red"):
        harness.admin.create_tenant(harness.principal, name)
    yield harness
    harness.close()


def report(h: LoopHarness, trial_id: int, lo_bytes: int, relay: int, hooks: int) -> None:
    """Both ranks of the trial (one node, one namespace) report their namespace's counters."""
    key = h.key(trial_id)
    attempt = h.executor.attempts[key]
    sample = NamespaceSample(f"th-{key}", (("lo", Counters(lo_bytes, lo_bytes)),), relay)
    attempt.ranks = [
        replace(r, node_id="node-0", network=sample, hooks_wire_bytes=hooks) for r in attempt.ranks
    ]


def test_two_tenants_trials_on_one_node_are_attributed_apart(h: LoopHarness) -> None:
    blue = h.submit(SPEC, tenant="blue")
    red = h.submit(SPEC, tenant="red")
    h.tick()
    for trial in (blue, red):
        h.executor.run(h.key(trial))
    report(h, blue, 300 * MiB, relay=10 * MiB, hooks=0)
    report(h, red, 40 * MiB, relay=0, hooks=0)
    h.tick()
    h.clock.step(11)
    report(h, blue, 500 * MiB, relay=10 * MiB, hooks=0)  # grew by 200 MiB
    h.tick()
    usage = UsageService(h.uow, h.clock).report(h.principal)
    intra = {r.tenant: r.intra_node_bytes for r in usage.rows}
    assert intra == {"blue": 490 * MiB, "red": 40 * MiB}
    assert all(r.inter_node_sent_bytes == 0 for r in usage.rows)
    csv = usage_csv(usage.rows).splitlines()
    assert csv[0].endswith("inter_node_sent_bytes,inter_node_received_bytes,intra_node_bytes")
    assert any(
        line.startswith(f"{usage.rows[0].day},blue,") and line.endswith(f",0,0,{490 * MiB}")
        for line in csv
    )
    # per rank: the node's figure split equally (the hooks counted nothing), from the kernel
    detail = ExperimentService(h.uow, h.store, h.clock).get_trial(h.principal, blue)
    assert {(t.rank, t.scope, t.sent_bytes, t.source) for t in detail.traffic} == {
        (0, "intra-node", 245 * MiB, "kernel"),
        (1, "intra-node", 245 * MiB, "kernel"),
    }
    with h.uow() as repo:
        rows = repo.traffic_by_trial()
    assert ("blue", blue, "intra-node", 490 * MiB, 490 * MiB) in rows
    assert ("red", red, "intra-node", 40 * MiB, 40 * MiB) in rows


def test_a_restarted_control_plane_counts_on_from_what_was_written(h: LoopHarness) -> None:
    trial = h.submit(SPEC, tenant="blue")
    h.tick()
    h.executor.run(h.key(trial))
    report(h, trial, 100 * MiB, relay=0, hooks=0)
    h.tick()
    h.loop.traffic = type(h.loop.traffic)()  # a new process: nothing in memory
    h.clock.step(11)
    report(h, trial, 150 * MiB, relay=0, hooks=0)
    h.tick()
    usage = UsageService(h.uow, h.clock).report(h.principal)
    assert [r.intra_node_bytes for r in usage.rows] == [150 * MiB]
