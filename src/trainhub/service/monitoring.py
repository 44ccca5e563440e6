"""Node monitoring: samples from the node agents, series with downsampled retention, node health.

The agents (``trainhub.adapters.monitor``) sample each node every few seconds; the control loop
pulls what they gathered once a tick (:meth:`MonitoringService.refresh`) and this service keeps:

- the latest sample and hardware inventory of every node;
- series per node and metric in three tiers: every sample for 15 minutes, 1-minute means for
  a day, 15-minute means for a week (memory stays bounded: ~2,300 points, 40 KiB a series);
- each node's health, judged by :func:`judge_node` (pure): a lost agent, uncorrected ECC
  errors or hardware/thermal throttling make a node unhealthy;
- admin controls (cordon, drain), persisted through a :class:`NodeControlStore`.

A node takes new trials only when it is healthy and not cordoned (:meth:`node_overlay`, read
by the scheduling view); a draining node is cordoned and its trials are preempted by checkpoint
(the control loop asks :meth:`draining_nodes`).
"""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from trainhub.core.errors import NotFound
from trainhub.core.resources import Node
from trainhub.core.scheduling.view import NodeOverlay
from trainhub.core.states import TrialState
from trainhub.service.auth import require_admin
from trainhub.service.clock import Clock
from trainhub.service.ports import Principal
from trainhub.service.repository import UnitOfWork

__all__ = [
    "ClusterMetrics",
    "GpuSample",
    "LatencyHistogram",
    "MonitoringService",
    "NodeControl",
    "NodeControlStore",
    "NodeHealth",
    "NodeInventory",
    "NodeMonitor",
    "NodeSample",
    "NodeStatus",
    "Series",
    "gather_cluster_metrics",
    "judge_node",
]

# NVML throttle (clock event) reasons that mean the hardware is in trouble; power capping by
# software and idle clocks are normal operation and do not count
BAD_THROTTLE_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake", "sw_thermal_slowdown"}
)


@dataclass(frozen=True, kw_only=True)
class GpuSample:
    """One GPU at one instant (NVML). Temperatures in Celsius, power in watts."""

    index: int
    uuid: str
    utilization_pct: float
    memory_used_gb: float
    memory_total_gb: float
    temperature_c: float
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    ecc_uncorrected: int = 0  # volatile (since the driver loaded) uncorrected ECC errors
    throttle_reasons: tuple[str, ...] = ()
    trial_ids: tuple[int, ...] = ()  # trials whose rank processes use this GPU


@dataclass(frozen=True, kw_only=True)
class NodeSample:
    """One node at one instant (psutil, and NVML where GPUs exist)."""

    node_id: str
    at: float
    cpu_pct: float
    memory_used_gb: float
    memory_total_gb: float
    net_sent_bytes: int = 0  # counters since boot
    net_recv_bytes: int = 0
    disk_used_pct: float = 0.0
    gpus: tuple[GpuSample, ...] = ()
    # trial id -> (cpu %, resident GB) of its rank process trees on this node
    trials: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    def values(self) -> dict[str, float]:
        """The sample as named series values (what :class:`Series` keeps)."""
        out = {
            "cpu_pct": self.cpu_pct,
            "memory_used_gb": self.memory_used_gb,
            "disk_used_pct": self.disk_used_pct,
        }
        for gpu in self.gpus:
            out[f"gpu{gpu.index}.utilization_pct"] = gpu.utilization_pct
            out[f"gpu{gpu.index}.memory_used_gb"] = gpu.memory_used_gb
            out[f"gpu{gpu.index}.temperature_c"] = gpu.temperature_c
            if gpu.power_w is not None:
                out[f"gpu{gpu.index}.power_w"] = gpu.power_w
        return out


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """The hardware of one node, read once by its agent."""

    node_id: str
    hostname: str
    cpu_model: str
    num_cores: int
    memory_gb: float
    gpus: tuple[Mapping[str, str], ...] = ()  # model, memory_gb, driver, uuid per GPU
    nics: tuple[Mapping[str, str], ...] = ()  # name, speed_mbps, address per interface
    # from the agent's configuration (TRAINHUB_NODE_LABELS, /etc/trainhub/node-labels):
    # topology levels (rack, block) and any other label (core/topology.py)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeHealth:
    healthy: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeControl:
    """What an admin asked of a node."""

    node_id: str
    cordoned: bool = False
    draining: bool = False
    reason: str = ""
    updated_at: float = 0.0


@dataclass(frozen=True)
class NodeStatus:
    """Everything known of one node, as the API and the CLI show it."""

    node_id: str
    health: NodeHealth
    control: NodeControl
    last_seen: float | None
    latest: NodeSample | None
    inventory: NodeInventory | None
    labels: Mapping[str, str] = field(default_factory=dict)  # the agent's, then stored ones

    @property
    def schedulable(self) -> bool:
        return self.health.healthy and not self.control.cordoned and not self.control.draining


class NodeMonitor(Protocol):
    """Port: the node agents (one per node of the cluster)."""

    def collect(self) -> list[NodeSample]:
        """Samples taken since the last call, from every agent that answered."""
        ...

    def inventory(self) -> list[NodeInventory]:
        """The hardware of every node whose agent answered."""
        ...


class NodeControlStore(Protocol):
    """Port: admin controls and health history of nodes, kept in the database."""

    def node_controls(self) -> dict[str, NodeControl]: ...

    def set_node_control(self, control: NodeControl) -> None: ...

    def add_health_event(self, node_id: str, at: float, healthy: bool, reason: str) -> None: ...

    def health_events(self, node_id: str, limit: int) -> list[tuple[float, bool, str]]: ...

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Labels set with `trainhub nodes label`, per node."""
        ...

    def set_node_labels(self, node_id: str, labels: Mapping[str, str], at: float) -> None:
        """Replace the node's stored labels (empty: none)."""
        ...


def judge_node(
    latest: NodeSample | None, last_seen: float | None, now: float, lost_after_s: float
) -> NodeHealth:
    """The health of a node from its latest sample: pure, the rules in one place.

    A node whose agent has not reported for ``lost_after_s`` is unhealthy (``last_seen``: its
    latest report, or when the node was first known while it never reported); so is a node
    with a GPU that reports uncorrected ECC errors or hardware/thermal throttling.
    """
    reasons: list[str] = []
    silent_s = now - last_seen if last_seen is not None else math.inf
    if silent_s > lost_after_s:
        what = "no report" if latest is not None else "no report ever"
        reasons.append(f"monitoring agent lost: {what} for {silent_s:.0f} s")
    for gpu in latest.gpus if latest is not None else ():
        if gpu.ecc_uncorrected > 0:
            reasons.append(f"GPU {gpu.index}: {gpu.ecc_uncorrected} uncorrected ECC errors")
        bad = sorted(BAD_THROTTLE_REASONS.intersection(gpu.throttle_reasons))
        if bad:
            reasons.append(f"GPU {gpu.index} throttled: {', '.join(bad)}")
    return NodeHealth(not reasons, tuple(reasons))


class _Points:
    """(time, value) pairs in time order, in two float arrays (16 bytes a point, not ~110 as
    tuples in a deque): appended at the end, trimmed at the front."""

    def __init__(self) -> None:
        self.times = array("d")
        self.values = array("d")
        self.start = 0

    def append(self, at: float, value: float) -> None:
        self.times.append(at)
        self.values.append(value)

    def trim(self, before: float) -> None:
        self.start = bisect.bisect_left(self.times, before, lo=self.start)
        if self.start > 64 and self.start * 2 > len(self.times):
            del self.times[: self.start]
            del self.values[: self.start]
            self.start = 0

    def first(self) -> float | None:
        return self.times[self.start] if self.start < len(self.times) else None

    def between(self, since: float, until: float) -> list[tuple[float, float]]:
        lo = bisect.bisect_left(self.times, since, lo=self.start)
        hi = bisect.bisect_right(self.times, until, lo=lo)
        return list(zip(self.times[lo:hi], self.values[lo:hi], strict=True))

    def __len__(self) -> int:
        return len(self.times) - self.start


class Series:
    """One metric of one node, with downsampled retention.

    Tiers of (bucket width, kept for): raw samples for ``raw_keep_s``, then means per bucket:
    1-minute means for a day, 15-minute means for a week (at one sample per 5 s: ~2,300
    points, 40 KiB a series measured). Prometheus is the long-term store. A query over any
    range finds the finest data kept for it.
    """

    TIERS: tuple[tuple[float, float], ...] = ((60.0, 24 * 3600.0), (900.0, 7 * 24 * 3600.0))

    def __init__(self, raw_keep_s: float = 900.0) -> None:
        self.raw_keep_s = raw_keep_s
        self.raw = _Points()
        self.tiers = [_Points() for _ in self.TIERS]
        # the open bucket of each tier: (start, sum, count)
        self._open: list[tuple[float, float, int] | None] = [None for _ in self.TIERS]

    def add(self, at: float, value: float) -> None:
        self.raw.append(at, value)
        for i, (width, keep_s) in enumerate(self.TIERS):
            start = at - at % width
            current = self._open[i]
            if current is None or current[0] != start:
                if current is not None:
                    self.tiers[i].append(current[0], current[1] / current[2])
                self._open[i] = (start, value, 1)
            else:
                self._open[i] = (start, current[1] + value, current[2] + 1)
            self.tiers[i].trim(at - keep_s)
        self.raw.trim(at - self.raw_keep_s)

    def points(self, since: float, until: float) -> list[tuple[float, float]]:
        """The finest points kept for ``[since, until]``: raw where raw reaches back so far,
        else the finest tier that does (each point: (time, value or bucket mean))."""
        first = self.raw.first()
        if first is not None and first <= since:
            return self.raw.between(since, until)
        for i, points in enumerate(self.tiers):
            current = self._open[i]
            tail = [(current[0], current[1] / current[2])] if current is not None else []
            oldest = points.first()
            if oldest is None and tail:
                oldest = tail[0][0]
            if oldest is not None and (oldest <= since or i == len(self.tiers) - 1):
                return points.between(since, until) + [p for p in tail if since <= p[0] <= until]
        return self.raw.between(since, until)

    def __len__(self) -> int:
        return len(self.raw) + sum(len(t) for t in self.tiers)


class LatencyHistogram:
    """Cumulative latency buckets in seconds (exported as a Prometheus histogram)."""

    BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = [0] * (len(self.BUCKETS) + 1)
        self.total_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.BUCKETS, seconds)] += 1
            self.total_s += seconds
            self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, cumulative count) pairs ending with +Inf, as Prometheus wants them."""
        with self._lock:
            out, running = [], 0
            for bound, n in zip((*map(str, self.BUCKETS), "+Inf"), self.counts, strict=True):
                running += n
                out.append((bound, running))
            return out


@dataclass(frozen=True)
class ClusterMetrics:
    """What /metrics exports besides the node samples, read from the database at scrape time."""

    trials_by_state: dict[tuple[str, str], int]  # (tenant, state) -> live trials
    queue_length: dict[str, int]  # tenant -> queued trials
    oldest_wait_s: dict[str, float]  # tenant -> longest wait of a queued trial
    held_slots: dict[str, int]  # tenant -> slots its open attempts hold
    guaranteed_slots: dict[str, int]  # tenant -> its guarantee
    trial_tenants: dict[int, str]  # live trial -> tenant (labels of per-GPU metrics)


LIVE_STATES = (
    TrialState.QUEUED,
    TrialState.SCHEDULED,
    TrialState.RUNNING,
    TrialState.PREEMPTING,
    TrialState.PAUSED,
)


_HOLDING = (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING)


def gather_cluster_metrics(uow: UnitOfWork, now: float) -> ClusterMetrics:
    """Counts of live (non-terminal) trials, the queue and tenant usage: one short read."""
    with uow() as repo:
        live = repo.scheduling_records(list(LIVE_STATES))  # the narrow columns (ADR 0023)
        active = [t for t in live if t.state in _HOLDING]
        attempts = repo.open_attempts([t.id for t in active])
        tenants = repo.list_tenants()
    by_state: dict[tuple[str, str], int] = {}
    queue: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for trial in live:
        key = (trial.tenant, trial.state.value.lower())
        by_state[key] = by_state.get(key, 0) + 1
        if trial.state is TrialState.QUEUED:
            queue[trial.tenant] = queue.get(trial.tenant, 0) + 1
            oldest[trial.tenant] = max(oldest.get(trial.tenant, 0.0), now - trial.queued_at)
    held = {t.name: 0 for t in tenants}
    for trial in active:
        attempt = attempts.get(trial.id)
        if attempt is not None:
            held[trial.tenant] = held.get(trial.tenant, 0) + attempt.num_slots
    return ClusterMetrics(
        by_state,
        queue,
        oldest,
        held,
        {t.name: t.guaranteed_slots for t in tenants},
        {t.id: t.tenant for t in live},
    )


class MonitoringService:
    """Keeps what the node agents report and decides which nodes may take new trials."""

    def __init__(
        self,
        monitor: NodeMonitor | None,
        controls: NodeControlStore,
        clock: Clock,
        *,
        lost_after_s: float = 30.0,
        inventory_refresh_s: float = 300.0,
    ) -> None:
        self.monitor = monitor
        self.controls = controls
        self.clock = clock
        self.lost_after_s = lost_after_s
        self.inventory_refresh_s = inventory_refresh_s
        self.decision_latency = LatencyHistogram()
        self.api_latency: dict[tuple[str, ...], LatencyHistogram] = {}
        self._lock = threading.Lock()
        self._latest: dict[str, NodeSample] = {}
        self._last_seen: dict[str, float] = {}
        self._first_known: dict[str, float] = {}  # nodes listed by the executor, when first
        self._series: dict[tuple[str, str], Series] = {}
        self._inventory: dict[str, NodeInventory] = {}
        self._stored_labels: dict[str, dict[str, str]] | None = None  # read once, then on change
        self._inventory_at = float("-inf")
        self._health: dict[str, NodeHealth] = {}
        self._controls: dict[str, NodeControl] | None = None

    # ------------------------------------------------------------ the control loop's side
    def refresh(self, known_nodes: Iterable[str] = ()) -> None:
        """Pull the agents' samples, judge every node's health, record health changes."""
        now = self.clock()
        known = list(known_nodes)
        samples = self.monitor.collect() if self.monitor is not None else []
        inventory = None
        # agents answer one pull later: ask every tick while a node's hardware is unknown
        missing = any(n not in self._inventory for n in (*known, *self._latest))
        if self.monitor is not None and (
            missing or now - self._inventory_at >= self.inventory_refresh_s
        ):
            inventory = {i.node_id: i for i in self.monitor.inventory()}
        self.record(samples, inventory)
        if inventory is not None and all(n in self._inventory for n in known):
            self._inventory_at = now
        # without agents (monitoring off) no node is judged: none would ever report, and every
        # node would count as lost after the grace period (the executor's view stays)
        self.judge(now, known if self.monitor is not None else ())

    def record(
        self, samples: Sequence[NodeSample], inventory: Mapping[str, NodeInventory] | None = None
    ) -> None:
        with self._lock:
            if inventory:
                self._inventory.update(inventory)
            for sample in sorted(samples, key=lambda s: s.at):
                self._latest[sample.node_id] = sample
                self._last_seen[sample.node_id] = max(
                    sample.at, self._last_seen.get(sample.node_id, sample.at)
                )
                for name, value in sample.values().items():
                    key = (sample.node_id, name)
                    series = self._series.get(key)
                    if series is None:
                        series = self._series[key] = Series()
                    series.add(sample.at, value)

    def judge(self, now: float, known_nodes: Iterable[str] = ()) -> dict[str, NodeHealth]:
        """Judge every node seen or known; a change of health goes to the history."""
        with self._lock:
            for node_id in known_nodes:
                self._first_known.setdefault(node_id, now)
            changes = []
            for node_id in {*self._latest, *self._first_known}:
                health = judge_node(
                    self._latest.get(node_id),
                    self._last_seen.get(node_id, self._first_known.get(node_id)),
                    now,
                    self.lost_after_s,
                )
                before = self._health.get(node_id)
                if before is None or before.healthy != health.healthy:
                    changes.append((node_id, health))
                self._health[node_id] = health
        for node_id, health in changes:
            reason = "; ".join(health.reasons) or "healthy"
            self.controls.add_health_event(node_id, now, health.healthy, reason)
        return dict(self._health)

    def node_overlay(self) -> dict[str, NodeOverlay]:
        """Per node seen: may it take new trials, its hottest GPU's temperature, and why not
        in words ("cordoned", "draining", "unhealthy", joined by "and"), for the scheduler.

        Nodes the monitor never saw are absent: without an agent the scheduler keeps its
        executor's view (a cluster without monitoring schedules as before).
        """
        controls = self._control_map()
        with self._lock:
            out: dict[str, NodeOverlay] = {}
            labels = self._labels_locked()
            for node_id in {*self._health, *controls, *labels}:
                health = self._health.get(node_id)
                control = controls.get(node_id, NodeControl(node_id))
                held = [
                    word
                    for word, why in (
                        ("draining", control.draining),
                        ("cordoned", control.cordoned and not control.draining),
                        ("unhealthy", health is not None and not health.healthy),
                    )
                    if why
                ]
                latest = self._latest.get(node_id)
                temps = [g.temperature_c for g in latest.gpus] if latest else []
                out[node_id] = NodeOverlay(
                    not held, max(temps) if temps else None, " and ".join(held),
                    labels.get(node_id) or None,
                )  # fmt: skip
            return out

    def _labels_locked(self) -> dict[str, dict[str, str]]:
        """Per node, its agent's labels with the stored ones over them."""
        stored = self._stored_labels
        if stored is None:
            stored = self._stored_labels = self.controls.node_labels()
        merged = {n: dict(i.labels) for n, i in self._inventory.items() if i.labels}
        for node_id, labels in stored.items():
            merged[node_id] = {**merged.get(node_id, {}), **labels}
        return merged

    def set_labels(
        self, principal: Principal, node_id: str, changes: Mapping[str, str]
    ) -> dict[str, str]:
        """Admins: set labels on a node (``rack=r3``; an empty value removes one); returns
        the node's stored labels."""
        require_admin(principal)
        stored = dict(self.controls.node_labels().get(node_id, {}))
        for key, value in changes.items():
            if value:
                stored[key] = value
            else:
                stored.pop(key, None)
        self.controls.set_node_labels(node_id, stored, self.clock())
        with self._lock:
            self._stored_labels = None
        return stored

    def labelled(self, nodes: Sequence[Node]) -> list[Node]:
        """``nodes`` with their agents' and stored labels over the cluster engine's (what the
        submit check and the cluster views read, as the scheduler does through the overlay)."""
        with self._lock:
            labels = self._labels_locked()
        return [
            replace(n, labels={**n.labels, **labels[n.node_id]}) if n.node_id in labels else n
            for n in nodes
        ]

    def draining_nodes(self) -> set[str]:
        return {n for n, c in self._control_map().items() if c.draining}

    def observe_decision(self, seconds: float) -> None:
        self.decision_latency.observe(seconds)

    def observe_request(self, method: str, route: str, seconds: float) -> None:
        key = (method, route)
        histogram = self.api_latency.get(key)
        if histogram is None:
            histogram = self.api_latency.setdefault(key, LatencyHistogram())
        histogram.observe(seconds)

    # ------------------------------------------------------------ the API's side
    def nodes(self, known_nodes: Iterable[str] = ()) -> list[NodeStatus]:
        controls = self._control_map()
        with self._lock:
            labels = self._labels_locked()
            ids = sorted({*self._latest, *self._inventory, *controls, *known_nodes, *labels})
            return [
                NodeStatus(
                    node_id=n,
                    health=self._health.get(n)
                    or judge_node(
                        self._latest.get(n), self._last_seen.get(n), self.clock(), self.lost_after_s
                    ),
                    control=controls.get(n, NodeControl(n)),
                    last_seen=self._last_seen.get(n),
                    latest=self._latest.get(n),
                    inventory=self._inventory.get(n),
                    labels=labels.get(n, {}),
                )
                for n in ids
            ]

    def inventories(self) -> dict[str, NodeInventory]:
        """Node id: its hardware, for every node whose agent reported it."""
        with self._lock:
            return dict(self._inventory)

    def hostnames(self) -> dict[str, str]:
        """Node id: hostname, for every node whose agent reported its inventory."""
        return {n: i.hostname for n, i in self.inventories().items() if i.hostname}

    def resolve(self, name: str, known_nodes: Iterable[str] = ()) -> str:
        """A node id from an id, a unique id prefix (6+ characters) or a hostname."""
        candidates = {*self._latest, *self._inventory, *self._control_map(), *known_nodes}
        if name in candidates:
            return name
        by_host = [n for n, i in self._inventory.items() if i.hostname == name]
        by_prefix = [n for n in candidates if len(name) >= 6 and n.startswith(name)]
        matches = sorted(set(by_host or by_prefix))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise NotFound(
                f"node {name!r} is ambiguous: {', '.join(m[:12] for m in matches)}",
                hint="give more characters of the node id",
            )
        raise NotFound(f"no node {name!r}", hint="`trainhub nodes` lists the nodes")

    def series(
        self, node_id: str, metric: str, since: float, until: float
    ) -> list[tuple[float, float]]:
        with self._lock:
            series = self._series.get((node_id, metric))
            if series is None:
                raise NotFound(
                    f"no series {metric!r} for node {node_id}",
                    hint="metrics: "
                    + ", ".join(sorted(m for n, m in self._series if n == node_id)),
                )
            return series.points(since, until)

    def trial_usage(self, trial_id: int) -> list[tuple[NodeStatus, tuple[GpuSample, ...]]]:
        """The nodes a trial's processes were last seen on, each with the GPUs it uses there
        (the caller checks that the trial may be seen)."""
        out = []
        for status in self.nodes():
            latest = status.latest
            if latest is None:
                continue
            gpus = tuple(g for g in latest.gpus if trial_id in g.trial_ids)
            if gpus or trial_id in latest.trials:
                out.append((status, gpus))
        return out

    def health_history(self, node_id: str, limit: int = 50) -> list[tuple[float, bool, str]]:
        return self.controls.health_events(node_id, limit)

    def set_control(
        self,
        principal: Principal,
        node_id: str,
        *,
        cordoned: bool,
        draining: bool,
        reason: str = "",
    ) -> NodeControl:
        """Cordon (no new trials), drain (cordon, and preempt its trials) or uncordon a node."""
        require_admin(principal)
        control = NodeControl(node_id, cordoned, draining, reason, self.clock())
        self.controls.set_node_control(control)
        self._controls = None
        return control

    def _control_map(self) -> dict[str, NodeControl]:
        controls = self._controls
        if controls is None:
            controls = self._controls = self.controls.node_controls()
        return controls
