"""The node agent: one small Ray actor per node, sampling on its own thread; the control plane
pulls what it gathered once a tick (docs/adr/0012-node-monitoring-agent.md).

Ray already knows the nodes, places an actor on each (node affinity, zero CPUs reserved so it
never takes a trial's slot) and tells when one dies: no protocol of our own between machines.
A dead or silent agent is noticed by the health rules (no report for ``lost_after_s``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainhub.adapters import node_leftovers
from trainhub.adapters.monitor.sampler import NodeSampler
from trainhub.adapters.ray_executor.executor import connect
from trainhub.service.monitoring import NodeInventory, NodeSample

log = logging.getLogger(__name__)
AGENT_PREFIX = "trainhub-monitor-"


class AgentLoop:
    """Samples every ``interval_s`` on a daemon thread into a bounded buffer (the actor's body,
    also usable in-process)."""

    def __init__(self, node_id: str, interval_s: float = 5.0, max_buffered: int = 720) -> None:
        self.sampler = NodeSampler(node_id)
        self.interval_s = interval_s
        self._buffer: deque[NodeSample] = deque(maxlen=max_buffered)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainhub-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_sweep: list[float] = []
        while True:
            # what rank actors that died outright left on the node (cgroups, network names)
            node_leftovers.sweep_quietly(last_sweep)
            try:
                sample = self.sampler.sample()
            except Exception:  # one failed reading must not end the agent
                log.exception("sampling failed")
                continue
            with self._lock:
                self._buffer.append(sample)
            if self._stop.wait(self.interval_s):
                return

    def drain(self) -> list[NodeSample]:
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def inventory(self) -> NodeInventory:
        return self.sampler.inventory()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + 1)


class NodeAgent:
    """The actor: an :class:`AgentLoop` on its node (zero CPUs reserved)."""

    def __init__(self, node_id: str, interval_s: float) -> None:
        self.loop = AgentLoop(node_id, interval_s)

    def drain(self) -> list[NodeSample]:
        return self.loop.drain()

    def inventory(self) -> NodeInventory:
        return self.loop.inventory()

    def pid(self) -> int:
        import os

        return os.getpid()


_REMOTE_AGENT: Any = ray.remote(num_cpus=0, max_restarts=-1)(NodeAgent)


class RayNodeMonitor:
    """:class:`~trainhub.service.monitoring.NodeMonitor` over one agent actor per alive node."""

    def __init__(
        self, address: str, namespace: str, interval_s: float = 5.0, timeout_s: float = 2.0
    ) -> None:
        self.address = address
        self.namespace = namespace
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._agents: dict[str, Any] = {}
        self._pending: dict[str, dict[Any, str]] = {}  # method -> unanswered ref -> node
        self._connection = -1

    def _ensure_agents(self) -> dict[str, Any]:
        connection = connect(self.address, self.namespace)
        if connection != self._connection:
            self._agents.clear()
            self._pending.clear()
            self._connection = connection
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
        for node_id in alive - self._agents.keys():
            self._agents[node_id] = _REMOTE_AGENT.options(
                name=AGENT_PREFIX + node_id,
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_id, self.interval_s)
        for node_id in self._agents.keys() - alive:
            del self._agents[node_id]  # the node left; its actor went with it
        return self._agents

    def _harvest(self, method: str) -> list[Any]:
        """What the agents answered since the last call; never blocks a control-loop tick.

        Each call collects the answers that are ready and asks every agent without a pending
        question again, so an answer arrives one tick after it was asked.
        """
        agents = self._ensure_agents()
        pending = self._pending.setdefault(method, {})
        out = []
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                node_id = pending.pop(ref)
                try:
                    out.append(ray.get(ref))
                except ray.exceptions.RayError as exc:  # its health rule notices the silence
                    log.warning("monitoring agent on %s: %s", node_id, exc)
        asked = set(pending.values())
        for node_id, agent in agents.items():
            if node_id not in asked:
                pending[getattr(agent, method).remote()] = node_id
        return out

    def collect(self) -> list[NodeSample]:
        return [s for batch in self._harvest("drain") for s in batch]

    def inventory(self) -> list[NodeInventory]:
        return list(self._harvest("inventory"))
