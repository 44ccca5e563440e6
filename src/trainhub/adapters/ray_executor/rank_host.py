"""Rank hosts: one long-lived Ray actor per node that runs the :class:`RankWorker` of CPU ranks
in its own process, so that starting an attempt no longer starts a Ray worker process per rank
(ADR 0031).

Ray starts a new worker process for every actor (an interpreter that imports ray: 1-3 s on a
loaded node); the placement group itself is created in milliseconds. A host is started once per
node and namespace (``num_cpus=0``, no placement group: it never holds a slot); the attempt's
placement group still reserves the ranks' CPUs and memory, exactly as for per-rank actors, and a
hosted rank starts once its bundle is placed (:meth:`RankHost.start` waits for that on a thread).

A hosted rank is found by the same name a rank actor would have (``actor_name``); the executor
talks to it through :class:`HostedRank`, which offers the calls of a rank actor's handle
(``status``, ``terminate``, ``cleanup``, ``master_address``, ``gpu_ids``). The host never runs
user code: every rank is a process of its own, started cold or from the warm pool, as from a
rank actor. What is shared is the host process: when it dies, every rank it hosted on that node
dies with it (their processes die with their forking thread, as with a rank actor), and the
executor reports them LOST; Ray restarts the host for the next attempts.

Ranks with GPUs keep their own actor: Ray tells an actor the GPU ids of its bundle, and only an
actor scheduled in the bundle learns them.

This module is imported inside Ray worker processes: standard library and ray only.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from trainhub.adapters.ray_executor import rank_worker
from trainhub.adapters.ray_executor.rank_worker import (
    WAITING,
    RankReport,
    RankSpec,
    RankWorker,
    actor_name,
)

HOST_PREFIX = "rank-host-"
# the code a host runs is the code of its start: a control plane started on new code must not
# hand its ranks to an old host (detached, it outlives the control plane), so a host's name
# carries a digest of the modules it runs; an old host keeps the ranks it runs, is still found
# by the prefix, and holds no resource once they end
_CODE = hashlib.sha256(
    b"".join(Path(m.__file__ or "").read_bytes() for m in (sys.modules[__name__], rank_worker))
).hexdigest()[:10]
_CALLS = frozenset(
    {
        "status",
        "terminate",
        "cleanup",
        "master_address",
        "gpu_ids",
        "spool_dir",
        "session_relay",
    }  # a session's socket and relay
)
_PLACED_POLL_S = 0.02


def host_name(node_id: str) -> str:
    return f"{HOST_PREFIX}{_CODE}-{node_id}"


class RankHost:
    """Hosts the rank workers of CPU ranks on one node (a threaded Ray actor)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ranks: dict[str, RankWorker] = {}
        self._waiting: dict[str, threading.Event] = {}  # name -> stop asked before it started
        self._node_id = ray.get_runtime_context().get_node_id()

    def ready(self) -> str:
        return self._node_id

    def start(self, spec: RankSpec, context_archive: bytes) -> None:
        """Register the rank now and start it once its bundle is placed (on a thread)."""
        name = actor_name(spec.attempt_key, spec.rank)
        stop = threading.Event()
        with self._lock:
            if name in self._ranks or name in self._waiting:
                raise ValueError(f"rank {name} already runs on this node")
            self._waiting[name] = stop
        thread = threading.Thread(
            target=self._start_when_placed,
            args=(name, spec, context_archive, stop),
            name=f"place-{name}",
            daemon=True,
        )
        thread.start()

    def call(self, name: str, method: str, *args: Any) -> Any:
        """One call of a rank actor's handle on the hosted rank ``name``."""
        if method not in _CALLS:
            raise ValueError(f"no such call on a rank: {method}")
        with self._lock:
            worker = self._ranks.get(name)
            stop = self._waiting.get(name)
            if worker is None and stop is None:
                raise LookupError(f"rank {name} is not on this node's rank host (it restarted?)")
            if worker is None and method == "master_address":
                # a sibling asks rank 0 for the rendezvous: wait until rank 0 starts
                self._lock.wait_for(lambda: name in self._ranks or name not in self._waiting)
                worker = self._ranks.get(name)
                if worker is None:
                    raise LookupError(f"rank {name} never started")
        if worker is not None:
            return getattr(worker, method)(*args)
        assert stop is not None
        return self._before_start(name, method, stop, *args)

    def drop(self, name: str) -> None:
        """Forget a released rank (its processes and files are gone: ``cleanup`` ran)."""
        with self._lock:
            worker = self._ranks.pop(name, None)
            stop = self._waiting.pop(name, None)
            self._lock.notify_all()
        if stop is not None:
            stop.set()
        if worker is not None:
            worker.cleanup()  # idempotent: a release that could not reach cleanup first

    def names(self) -> list[str]:
        with self._lock:
            return sorted({*self._ranks, *self._waiting})

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._ranks or name in self._waiting

    # --- on the host ---

    def _before_start(self, name: str, method: str, stop: threading.Event, *args: Any) -> Any:
        if method == "status":
            rank = int(name.rsplit("-rank", 1)[1])
            return RankReport(rank, 0, WAITING, None, b"", self._node_id, None)
        if method in ("terminate", "cleanup"):
            stop.set()
            return None
        if method == "gpu_ids":
            return []  # a hosted rank has none
        raise LookupError(f"rank {name} has not started: it has no {method} yet")

    def _start_when_placed(
        self, name: str, spec: RankSpec, archive: bytes, stop: threading.Event
    ) -> None:
        placed = _wait_placed(spec.attempt_key, stop.is_set)
        with self._lock:
            if self._waiting.pop(name, None) is None or not placed or stop.is_set():
                self._lock.notify_all()
                return
            try:
                self._ranks[name] = RankWorker(spec, archive)
            finally:
                self._lock.notify_all()


def _wait_placed(attempt_key: str, stopped: Callable[[], bool]) -> bool:
    """True once the attempt's placement group holds its resources; False when it is gone."""
    from ray.util.placement_group import get_placement_group, placement_group_table

    while not stopped():
        try:
            state = placement_group_table(get_placement_group(attempt_key)).get("state")
        except ValueError:  # removed (released before it was placed)
            return False
        if state == "CREATED":
            return True
        if state == "REMOVED":
            return False
        time.sleep(_PLACED_POLL_S)
    return False


class _Call:
    def __init__(self, host: Any, name: str, method: str) -> None:
        self._host, self._name, self._method = host, name, method

    def remote(self, *args: Any) -> Any:
        return self._host.call.remote(self._name, self._method, *args)


class HostedRank:
    """The handle of a hosted rank: ``handle.status.remote(...)`` as on a rank actor's."""

    def __init__(self, host: Any, name: str) -> None:
        self.host = host
        self.name = name

    def __getattr__(self, method: str) -> _Call:
        if method not in _CALLS:
            raise AttributeError(method)
        return _Call(self.host, self.name, method)

    def drop(self) -> None:
        """Forget the rank on its host (after ``cleanup``); what ``ray.kill`` is to an actor."""
        with contextlib.suppress(Exception):
            ray.get(self.host.drop.remote(self.name), timeout=5)


def find_host(namespace: str, node_id: str) -> Any | None:
    """The rank host of a node, or None when it has none (or it is gone)."""
    try:
        return ray.get_actor(host_name(node_id), namespace=namespace)
    except ValueError:
        return None


def ensure_host(namespace: str, node_id: str) -> Any:
    """The rank host of a node, created where missing (it holds no resource)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote: Any = ray.remote(RankHost)
    return remote.options(
        name=host_name(node_id),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
        max_concurrency=256,  # waits for a placement, a sibling's rendezvous, status calls
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
