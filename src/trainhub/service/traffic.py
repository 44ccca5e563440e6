"""Network traffic per attempt and rank, kept by the control loop (its one writer).

The loop hands every poll's rank statuses to :meth:`TrafficMeter.observe`: each rank's
reading of its trial's namespace counters and its hooks' count (core/traffic.py). Once a tick
:meth:`TrafficMeter.flush` writes what grew since the last write, at most every
``interval_s`` (a tick with nothing due writes nothing), into the day's rows of each attempt,
rank and scope; ``trainhub usage``, the trial page and /metrics read those rows.
"""

from __future__ import annotations

from trainhub.core.traffic import (
    Flow,
    NamespaceSample,
    RankTraffic,
    Scope,
    TrafficDelta,
    attribute,
    deltas,
)
from trainhub.service.ports import AttemptStatus
from trainhub.service.repository import Repository
from trainhub.service.usage import _day

DEFAULT_INTERVAL_S = 10.0
FORGET_AFTER_S = 3600.0  # an attempt not polled for this long has ended


def attempt_traffic(status: AttemptStatus) -> list[RankTraffic]:
    """What the attempt's ranks sent and received so far, per rank and scope."""
    node_of_rank = [
        r.node_id or f"rank{r.rank}" for r in sorted(status.ranks, key=lambda r: r.rank)
    ]
    samples: dict[str, NamespaceSample] = {}
    relay: dict[str, int] = {}
    hooks: dict[int, int] = {}
    for r in status.ranks:
        if r.hooks_wire_bytes is not None:
            hooks[r.rank] = r.hooks_wire_bytes
        sample = r.network
        if sample is None:
            continue
        node = node_of_rank[r.rank] if r.rank < len(node_of_rank) else sample.namespace
        relay[node] = max(relay.get(node, 0), sample.relay_bytes)
        best = samples.get(node)
        if best is None or _total(sample) > _total(best):  # the latest reading of the node
            samples[node] = sample
    kernel: dict[str, dict[Scope, Flow]] = {}
    for node, sample in samples.items():
        with_relay = NamespaceSample(sample.namespace, sample.interfaces, relay[node])
        kernel[node] = with_relay.flows()
    return attribute(node_of_rank, kernel, hooks)


def _total(sample: NamespaceSample) -> int:
    return sum(c.rx_bytes + c.tx_bytes for _, c in sample.interfaces)


class TrafficMeter:
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._now: dict[int, list[RankTraffic]] = {}  # attempt id -> latest figures
        self._trial: dict[int, int] = {}  # attempt id -> trial id
        self._written: dict[int, dict[tuple[int, str], Flow]] = {}  # attempt id -> as written
        self._flushed_at = float("-inf")
        self._seen_at: dict[int, float] = {}  # attempt id -> when last observed (flush time)

    def observe(self, trial_id: int, attempt_id: int, status: AttemptStatus) -> None:
        if not any(r.network is not None or r.hooks_wire_bytes is not None for r in status.ranks):
            return
        figures = attempt_traffic(status)
        if figures:
            self._now[attempt_id] = figures
            self._trial[attempt_id] = trial_id

    def due(self, now: float) -> bool:
        return bool(self._now) and now - self._flushed_at >= self.interval_s

    def flush(self, repo: Repository, now: float) -> list[TrafficDelta]:
        """Write what grew since the last write (into ``now``'s UTC day); the deltas written."""
        self._flushed_at = now
        unseeded = [a for a in self._now if a not in self._written]
        if unseeded:  # after a restart: what earlier processes wrote
            self._written.update(repo.traffic_totals(unseeded))
        grown: list[TrafficDelta] = []
        for attempt_id, figures in self._now.items():
            grown += deltas(attempt_id, figures, self._written.get(attempt_id, {}))
        repo.add_traffic(_day(now), dict(self._trial), grown)
        for attempt_id, figures in self._now.items():
            self._written[attempt_id] = {(t.rank, t.scope.value): t.flow for t in figures}
            self._seen_at[attempt_id] = now
        self._now.clear()
        for attempt_id, seen in list(self._seen_at.items()):  # ended long ago: out of memory
            if now - seen > FORGET_AFTER_S:
                self._forget(attempt_id)
        return grown

    def _forget(self, attempt_id: int) -> None:
        self._written.pop(attempt_id, None)
        self._trial.pop(attempt_id, None)
        self._seen_at.pop(attempt_id, None)
