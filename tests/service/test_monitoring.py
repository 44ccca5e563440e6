"""Node monitoring: the health rules (pure), series retention, and the service on SQLite driving
the control loop one tick at a time (cordon, drain, a lost agent, temperatures)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.adapters.monitor.node_store import SqlNodeControlStore
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.scheduling.view import NodeFacts
from trainhub.core.states import TrialState
from trainhub.service.control_loop import LoopConfig
from trainhub.service.monitoring import (
    GpuSample,
    MonitoringService,
    NodeInventory,
    NodeSample,
    Series,
    judge_node,
)
from trainhub.service.scheduling_view import with_overlay

SPEC = "name: demo\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 2}\n"
NOW = 1_700_000_000.0


def gpu(**kw: object) -> GpuSample:
    base: dict[str, object] = {
        "index": 0, "uuid": "GPU-1", "utilization_pct": 90.0, "memory_used_gb": 10.0,
        "memory_total_gb": 80.0, "temperature_c": 60.0,
    }  # fmt: skip
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


def sample(node: str, at: float, *gpus: GpuSample, cpu: float = 10.0) -> NodeSample:
    return NodeSample(
        node_id=node, at=at, cpu_pct=cpu, memory_used_gb=1.0, memory_total_gb=8.0, gpus=gpus
    )


# ------------------------------------------------------------------ the rules, pure
def test_a_fresh_sample_without_faults_is_healthy() -> None:
    assert judge_node(sample("a", NOW, gpu()), NOW, NOW + 5, 30).healthy


def test_a_silent_agent_makes_its_node_unhealthy() -> None:
    health = judge_node(sample("a", NOW), NOW, NOW + 31, 30)
    assert not health.healthy
    assert health.reasons == ("monitoring agent lost: no report for 31 s",)


def test_a_node_never_reported_gets_a_grace_period_then_counts_as_lost() -> None:
    assert judge_node(None, NOW, NOW + 10, 30).healthy
    late = judge_node(None, NOW, NOW + 40, 30)
    assert not late.healthy
    assert "no report ever" in late.reasons[0]


def test_uncorrected_ecc_errors_make_a_node_unhealthy() -> None:
    health = judge_node(sample("a", NOW, gpu(ecc_uncorrected=2)), NOW, NOW, 30)
    assert health.reasons == ("GPU 0: 2 uncorrected ECC errors",)


def test_hardware_throttling_is_unhealthy_but_power_capping_is_not() -> None:
    capped = sample("a", NOW, gpu(throttle_reasons=("sw_power_cap", "gpu_idle")))
    assert judge_node(capped, NOW, NOW, 30).healthy
    hot = sample("a", NOW, gpu(index=3, throttle_reasons=("hw_thermal_slowdown",)))
    assert judge_node(hot, NOW, NOW, 30).reasons == ("GPU 3 throttled: hw_thermal_slowdown",)


def test_overlay_hides_unschedulable_nodes_and_brings_temperatures() -> None:
    facts = NodeFacts(node_id="a", total_gpus=8, total_cpus=64)
    assert with_overlay(facts, None) is facts
    assert with_overlay(facts, {"b": (False, None)}) is facts
    hot = with_overlay(facts, {"a": (True, 87.0)})
    assert hot.alive
    assert hot.gpu_temperature_c == 87.0
    assert not with_overlay(facts, {"a": (False, None)}).alive


# ------------------------------------------------------------------ retention
def test_series_keeps_raw_points_recently_and_means_further_back() -> None:
    series = Series(raw_keep_s=900)
    start = NOW - NOW % 86_400
    for i in range(2 * 86_400 // 30):  # two days, one point per 30 s, alternating 0 / 100
        series.add(start + 30 * i, 100.0 * (i % 2))
    end = start + 30 * (2 * 86_400 // 30 - 1)
    recent = series.points(end - 600, end)
    assert len(recent) == 21
    assert {v for _, v in recent} == {0.0, 100.0}
    hour_ago = series.points(end - 3 * 3600, end - 2 * 3600)
    assert len(hour_ago) == 60
    assert all(v == 50.0 for _, v in hour_ago)
    older = series.points(end - 40 * 3600, end - 30 * 3600)
    assert older
    assert {t % 900 for t, _ in older} == {0.0}
    # bounded: 15 min raw + a day of minutes + 2 days of quarter hours
    assert len(series) <= 31 + 1441 + 2 * 96 + 1
    # and the arrays behind it are compacted, not only skipped over
    assert len(series.tiers[0].times) <= 2 * len(series.tiers[0]) + 65


# ------------------------------------------------------------------ the service and the loop
class FakeMonitor:
    """The NodeMonitor port: hands out what the test queued."""

    def __init__(self) -> None:
        self.samples: list[NodeSample] = []

    def collect(self) -> list[NodeSample]:
        out, self.samples = self.samples, []
        return out

    def inventory(self) -> list[NodeInventory]:
        return [NodeInventory(node_id="node-0", hostname="gpu-a", cpu_model="x", num_cores=8,
                              memory_gb=8.0)]  # fmt: skip


@pytest.fixture
def h(tmp_path: Path) -> Iterator[LoopHarness]:
    harness = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(2), LoopConfig("http://127.0.0.1:1"))
    yield harness
    harness.close()


@pytest.fixture
def monitor(h: LoopHarness) -> FakeMonitor:
    fake = FakeMonitor()
    h.loop.monitoring = MonitoringService(fake, SqlNodeControlStore(h.engine), h.clock)
    return fake


def report_all(h: LoopHarness, monitor: FakeMonitor, *extra: NodeSample) -> None:
    monitor.samples += [sample(f"node-{i}", h.clock()) for i in range(2)] + list(extra)


def placed_on(h: LoopHarness, trial_id: int) -> set[str]:
    with h.uow() as repo:
        attempt = repo.open_attempt(trial_id)
    assert attempt is not None
    return set(attempt.placement)


def test_a_cordoned_node_gets_no_new_trials(h: LoopHarness, monitor: FakeMonitor) -> None:
    assert h.loop.monitoring is not None
    h.loop.monitoring.set_control(h.principal, "node-0", cordoned=True, draining=False)
    report_all(h, monitor)
    trial = h.submit(SPEC)
    assert h.tick().started == [trial]
    assert placed_on(h, trial) == {"node-1"}


def test_the_queue_says_cordoned_or_unhealthy_as_the_cause_is(
    h: LoopHarness, monitor: FakeMonitor
) -> None:
    service = h.loop.monitoring
    assert service is not None
    for node in ("node-0", "node-1"):
        service.set_control(h.principal, node, cordoned=True, draining=False)
    report_all(h, monitor)
    trial = h.submit(SPEC)
    assert h.tick().started == []
    reason = h.trial(trial).pending_reason or ""
    assert "the nodes it fits on are cordoned (node-0, node-1)" in reason
    assert "uncordons one" in reason
    assert "unhealthy" not in reason
    assert "never" not in reason
    # uncordoned, but the agents went silent: unhealthy, which an uncordon does not fix
    for node in ("node-0", "node-1"):
        service.set_control(h.principal, node, cordoned=False, draining=False)
    h.clock.step(60)
    h.tick()
    reason = h.trial(trial).pending_reason or ""
    assert "the nodes it fits on are unhealthy (node-0, node-1)" in reason
    assert "healthy again" in reason
    assert "cordon" not in reason


def test_a_node_with_ecc_errors_is_skipped_and_its_history_kept(
    h: LoopHarness, monitor: FakeMonitor
) -> None:
    service = h.loop.monitoring
    assert service is not None
    monitor.samples += [
        sample("node-0", h.clock(), gpu(ecc_uncorrected=1)),
        sample("node-1", h.clock()),
    ]
    trial = h.submit(SPEC)
    h.tick()
    assert placed_on(h, trial) == {"node-1"}
    status = {n.node_id: n for n in service.nodes()}
    assert not status["node-0"].schedulable
    assert status["node-0"].inventory is not None
    assert service.health_history("node-0", 10) == [
        (h.clock(), False, "GPU 0: 1 uncorrected ECC errors")
    ]


def test_without_monitoring_nodes_stay_schedulable_past_the_grace_period(
    h: LoopHarness,
) -> None:
    # `--monitor-interval 0`: no agent ever reports; the executor's view decides alone
    h.loop.monitoring = MonitoringService(None, SqlNodeControlStore(h.engine), h.clock)
    h.tick()
    h.clock.step(300)
    trial_id = h.submit(SPEC)
    h.tick()
    assert h.trial(trial_id).state == TrialState.SCHEDULED, h.trial(trial_id).pending_reason


def test_a_lost_agent_stops_new_trials_on_its_node(h: LoopHarness, monitor: FakeMonitor) -> None:
    report_all(h, monitor)
    h.tick()
    h.clock.step(60)
    monitor.samples.append(sample("node-1", h.clock()))  # node-0's agent went silent
    trial = h.submit(SPEC)
    h.tick()
    assert placed_on(h, trial) == {"node-1"}
    assert h.loop.monitoring is not None
    assert h.loop.monitoring.node_overlay()["node-0"] == (False, None, "unhealthy", None)


def test_draining_preempts_by_checkpoint_and_the_trial_resumes_elsewhere(
    h: LoopHarness, monitor: FakeMonitor
) -> None:
    report_all(h, monitor)
    trial = h.submit(SPEC)
    h.tick()
    first = placed_on(h, trial)
    h.executor.run(h.key(trial))
    h.tick()
    (node,) = first
    assert h.loop.monitoring is not None
    h.loop.monitoring.set_control(h.principal, node, cordoned=True, draining=True)
    report_all(h, monitor)
    h.tick()
    assert h.trial(trial).state == TrialState.PREEMPTING
    assert f"node {node} is draining" in h.events(trial)[-1]
    h.executor.exit(h.key(trial), [0, 0])  # it checkpointed and exited when asked
    for _ in range(3):
        report_all(h, monitor)
        h.clock.step(1)
        h.tick()
    other = {"node-0", "node-1"} - first
    assert placed_on(h, trial) == other


def test_temperatures_reach_the_scheduler(h: LoopHarness, monitor: FakeMonitor) -> None:
    monitor.samples.append(sample("node-0", h.clock(), gpu(temperature_c=91.0), gpu(index=1)))
    assert h.loop.monitoring is not None
    h.loop.monitoring.refresh(["node-0", "node-1"])
    overlay = h.loop.monitoring.node_overlay()
    assert overlay["node-0"] == (True, 91.0, "", None)
    assert overlay["node-1"] == (True, None, "", None)


class SlowInventory(FakeMonitor):
    """Like the Ray agents: an inventory asked for in one pull is answered in the next."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def inventory(self) -> list[NodeInventory]:
        self.asked += 1
        return super().inventory() if self.asked >= 2 else []


def test_the_inventory_is_asked_for_until_every_node_has_one(h: LoopHarness) -> None:
    monitor = SlowInventory()
    service = MonitoringService(monitor, SqlNodeControlStore(h.engine), h.clock)
    service.refresh(["node-0"])
    service.refresh(["node-0"])
    assert {n.node_id: n.inventory for n in service.nodes()}["node-0"] is not None
    service.refresh(["node-0"])
    assert monitor.asked == 2  # not again until the refresh interval has passed


def test_labels_from_the_agent_and_stored_ones_reach_the_scheduler_and_submit(
    h: LoopHarness, monitor: FakeMonitor
) -> None:
    """Topology labels (issue 30): the agent's configured ones, `trainhub nodes label`'s over
    them (stored: a new service reads them back), on the overlay and on the nodes the submit
    check reads."""
    assert h.loop.monitoring is not None
    monitoring = h.loop.monitoring
    monitor.inventory = lambda: [  # type: ignore[method-assign]
        NodeInventory(
            node_id="node-0",
            hostname="gpu-a",
            cpu_model="x",
            num_cores=8,
            memory_gb=8.0,
            labels={"rack": "r1", "block": "b1"},
        )
    ]
    monitoring.refresh(["node-0", "node-1"])
    assert monitoring.node_overlay()["node-0"].labels == {"rack": "r1", "block": "b1"}
    monitoring.set_labels(h.principal, "node-0", {"rack": "r9"})
    monitoring.set_labels(h.principal, "node-1", {"rack": "r2", "block": ""})
    again = MonitoringService(monitor, SqlNodeControlStore(h.engine), h.clock)
    again.refresh(["node-0", "node-1"])
    overlay = again.node_overlay()
    assert overlay["node-0"].labels == {"rack": "r9", "block": "b1"}
    assert overlay["node-1"].labels == {"rack": "r2"}
    labelled = again.labelled(cpu_nodes(2))
    assert [n.labels for n in labelled] == [{"rack": "r9", "block": "b1"}, {"rack": "r2"}]
    facts = with_overlay(NodeFacts(node_id="node-1", total_gpus=0, total_cpus=8.0), overlay)
    assert facts.labels == {"rack": "r2"}
