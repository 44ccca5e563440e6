"""The :class:`~trainhub.service.ports.Executor` on Ray: one placement group and one detached
named actor per rank for every attempt.

Everything the executor knows about an attempt is in Ray, found by name: the placement group is
called ``attempt_key`` and rank ``r``'s actor ``f"{attempt_key}-rank{r}"`` in the executor's
namespace. A control plane that restarts builds a new :class:`RayExecutor` and polls, terminates
and releases the attempts the old one launched (:meth:`RayExecutor.live_attempts` lists them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainhub.adapters.ray_executor import rank_host, warm_pool
from trainhub.adapters.ray_executor.node_environments import RayNodeInstaller
from trainhub.adapters.ray_executor.rank_worker import (
    EXITED,
    RUNNING,
    RankReport,
    RankSpec,
    RankWorker,
    actor_name,
    checkpoint_dir,
)
from trainhub.adapters.ray_executor.trial_folders import (
    discard_folder,
    event_files,
    freeze_folder,
)
from trainhub.core.errors import Conflict, TrainhubError
from trainhub.core.isolation import RENDEZVOUS_SECRET_ENV, NodeIsolation, TrialResources
from trainhub.core.resources import Node
from trainhub.core.spec import Placement
from trainhub.service.ports import (
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    RankPhase,
    RankStatus,
    SessionEndpoint,
)

logger = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"  # every Ray >= 2.49 node carries it; bundles can select on it
ACCELERATOR_LABEL = "ray.io/accelerator-type"
MAX_LOG_CHUNK = 1 << 20  # bytes of one rank's log returned by one poll
_GiB = 1024**3
_INLINE_ARCHIVE_BYTES = 64 * 1024  # below Ray's limit for arguments inlined in a task (100 KiB)
_ACTOR_NAME = re.compile(r"^(?P<key>.+)-rank(?P<rank>\d+)$")
_STRATEGIES = {Placement.PACK: "PACK", Placement.SPREAD: "SPREAD"}
_RankWorkerActor: Any = ray.remote(RankWorker)


class _Connection:
    """This process's link to Ray: ``number`` counts ray.init calls (handles die with one)."""

    lock = threading.Lock()
    number = 0


class ExecutorUnavailable(TrainhubError):
    """The Ray cluster cannot be reached (or this process is connected to another one)."""

    status_code = 503
    code = "executor_unavailable"


@dataclass
class _Attempt:
    """What this executor instance has learnt about one attempt (a cache of Ray's truth)."""

    pg: PlacementGroup
    world_size: int
    actors: dict[int, Any] = field(default_factory=dict)
    last: dict[int, RankStatus] = field(default_factory=dict)
    lost_reasons: dict[int, str] = field(default_factory=dict)


class RayExecutor:
    """Runs attempts on a Ray cluster.

    Args:
        address: the Ray cluster (``host:port`` of its GCS), e.g. from ``ensure_local_ray``.
        namespace: Ray namespace of the actors and placement groups; one per trainhub deployment.
        poll_timeout_s: the longest one :meth:`poll` waits for the rank actors to answer; a rank
            that does not answer in time keeps its last known phase.
        fail_fast_grace_s: when a rank exits with a non-zero code, its actor SIGTERMs the other
            ranks (SIGKILL after this many seconds) so that a gang stuck in a collective does
            not hold its GPUs; ``None`` leaves the other ranks running.
        exact_placement: pin rank ``r`` to ``launch.placement[r]`` with a bundle label selector
            on ``ray.io/node-id``; without it (or when a chosen node is gone) the placement
            group's PACK/SPREAD strategy decides.
        node_work_dir: where nodes unpack attempts (default ``$TRAINHUB_NODE_WORK_DIR`` on the
            node, else a directory under the node's temp dir).
        sandbox: ``bwrap`` runs every rank in a bubblewrap sandbox (trainhub.adapters.sandbox),
            ``none`` as a plain process; resolve ``auto`` with ``sandbox.resolve_mode`` first.
        checkpoint_root: where each trial's ``TRAINHUB_CHECKPOINT_DIR`` lives (a folder that
            outlives attempts; the control plane's storage root); default: the node work dir.
        data_dir: datasets every rank may read (``TRAINHUB_DATA_DIR``, read-only).
        dataset_cache_dir: where nodes cache tenant datasets by content hash (default: the
            node work dir's ``datasets``); dataset_cache_gb: its size cap in GiB.
        denied: paths never mounted into a sandbox (the control plane's home, database, ...).
        env_cache: where each node keeps the trial environments it installs itself (the same
            path on every node, each its own; default the node work dir's ``envs``): see
            :class:`~trainhub.adapters.ray_executor.node_environments.RayNodeInstaller`.
        isolation: the nodes' containment settings (cgroups, a network per trial, seccomp:
            core/isolation.py); applied to sandboxed ranks only.
        warm_pool_size: idle processes with torch imported kept on each node (warm_pool.py);
            used by unsandboxed ranks, and by sandboxed CPU ranks where the node agent is root
            (warm_sandbox.py); none where every rank would start cold anyway.
        hosted_ranks: CPU ranks placed on exact nodes run in the node's rank host
            (rank_host.py) instead of an actor each: no Ray worker process to start per rank.
        session_relay: ``auto`` reaches a session's server on this control plane's own Ray
            node through its socket and on any other node through the relay of its rank
            actor (ADR 0041); ``always`` uses the relay on every node.
    """

    def __init__(
        self,
        address: str,
        namespace: str = "trainhub",
        *,
        poll_timeout_s: float = 0.5,
        fail_fast_grace_s: float | None = 10.0,
        exact_placement: bool = True,
        node_work_dir: str | None = None,
        sandbox: str = "none",
        checkpoint_root: str | None = None,
        data_dir: str | None = None,
        denied: tuple[str, ...] = (),
        dataset_cache_dir: str | None = None,
        dataset_cache_gb: float | None = None,
        isolation: NodeIsolation | None = None,
        warm_pool_size: int = 0,
        hosted_ranks: bool = False,
        env_cache: str | None = None,
        session_relay: str = "auto",
    ) -> None:
        if sandbox not in ("bwrap", "none"):
            raise ValueError(f"sandbox must be 'bwrap' or 'none' (resolve 'auto' first): {sandbox}")
        self.sandbox = sandbox
        self._checkpoint_root = checkpoint_root
        self._env_cache = env_cache
        self._data_dir = data_dir
        self._dataset_cache_dir = dataset_cache_dir
        self._dataset_cache_bytes = int(dataset_cache_gb * _GiB) if dataset_cache_gb else None
        self._denied = tuple(denied)
        self.isolation = isolation if sandbox == "bwrap" else None
        self.address = address
        self.namespace = namespace
        self._poll_timeout_s = poll_timeout_s
        self._fail_fast_grace_s = fail_fast_grace_s
        self._exact_placement = exact_placement
        self._node_work_dir = node_work_dir
        self._attempts: dict[str, _Attempt] = {}
        # attempt key -> how its session server is reached (sessions; ADR 0041)
        self._endpoints: dict[str, SessionEndpoint] = {}
        if session_relay not in ("auto", "always"):
            raise ValueError(f"session_relay must be 'auto' or 'always': {session_relay}")
        self.session_relay = session_relay
        self._lock = threading.RLock()
        self._connection = connect(address, namespace)
        served = sandbox == "none" or os.geteuid() == 0  # warm_pool.cold_reason
        self.warm_pool_size = warm_pool_size if served else 0
        self._warm_nodes: frozenset[str] = frozenset()
        self._ensure_warm_pools()
        self.hosted_ranks = hosted_ranks
        self._hosts: dict[str, tuple[Any, Any]] = {}  # node id -> (host, its ready() reference)
        if hosted_ranks:
            self._ensure_hosts()

    def _ensure_warm_pools(self) -> None:
        """A warm pool on every node (warm_pool.py), where the executor's ranks may use one."""
        nodes = frozenset(n["NodeID"] for n in _ray_nodes() if n.get("Alive"))
        if nodes == self._warm_nodes:
            return
        try:
            warm_pool.ensure_pools(self.namespace, self._node_work_dir, self.warm_pool_size)
            self._warm_nodes = nodes
        except Exception:  # the pool only speeds starts up: ranks start cold without it
            logger.exception("could not start the warm pools")

    def _ensure_hosts(self) -> None:
        """A rank host on every alive node (rank_host.py), created where missing; they start
        in the background and serve once ready."""
        alive = {n["NodeID"] for n in _ray_nodes() if n.get("Alive")}
        self._hosts = {k: v for k, v in self._hosts.items() if k in alive}
        for node_id in alive - set(self._hosts):
            try:
                host = rank_host.ensure_host(self.namespace, node_id)
                self._hosts[node_id] = (host, host.ready.remote())
            except Exception:  # hosts only speed starts up: ranks get actors without one
                logger.exception("could not start the rank host of node %s", node_id)

    def _ready_hosts(self, launch: AttemptLaunch, exact: bool) -> dict[str, Any] | None:
        """The rank hosts that can run this attempt's ranks (one per node of its placement),
        or None: it needs GPUs, has no exact placement, or a host is not ready yet."""
        if not self.hosted_ranks or not exact or launch.gpus_per_worker:
            return None
        self._ensure_hosts()
        hosts = {}
        for node_id in set(launch.placement):
            host, ready = self._hosts.get(node_id, (None, None))
            if host is None:
                return None
            done, _ = ray.wait([ready], timeout=0)
            if not done:
                return None
            try:
                ray.get(done[0], timeout=0)
            except ray.exceptions.RayError:  # died: look it up again next time
                self._hosts.pop(node_id, None)
                return None
            hosts[node_id] = host
        return hosts

    def _connected(self) -> None:
        connection = connect(self.address, self.namespace)
        if connection != self._connection:
            self._attempts.clear()
            self._hosts.clear()
            self._connection = connection

    # --- cluster ---

    def cluster_nodes(self) -> list[Node]:
        from ray._private.state import available_resources_per_node

        with self._lock:
            self._connected()
            free_by_node: dict[str, dict[str, float]] = available_resources_per_node()  # type: ignore[no-untyped-call]
            nodes = []
            for info in _ray_nodes():
                if not info.get("Alive"):
                    continue
                node_id = info["NodeID"]
                total = info.get("Resources", {})
                free = free_by_node.get(node_id, {})
                labels = {k: v for k, v in info.get("Labels", {}).items() if k != NODE_ID_LABEL}
                nodes.append(
                    Node(
                        node_id=node_id,
                        total_gpus=int(total.get("GPU", 0)),
                        total_cpus=float(total.get("CPU", 0.0)),
                        free_gpus=int(free.get("GPU", 0)),
                        free_cpus=float(free.get("CPU", 0.0)),
                        labels=labels,
                        gpu_model=_gpu_model(labels, total),
                        # Ray's "memory" resource (bytes) is what its placement groups can
                        # reserve; the bundles ask for memory_gb_per_worker of it, in GiB
                        total_memory_gb=float(total.get("memory", 0.0)) / _GiB,
                        free_memory_gb=float(free.get("memory", 0.0)) / _GiB,
                        hostname=info.get("NodeManagerHostname") or None,
                    )
                )
            return nodes

    def node_installer(self) -> RayNodeInstaller:
        """Installs trial environments on the nodes, into the caches the ranks look in."""
        return RayNodeInstaller(self._connected, self._env_cache, self._node_work_dir)

    def node_addresses(self) -> list[str]:
        """The IP addresses of the cluster's live nodes (the failed-authentication limit
        never locks one out as a whole: every trial of a node shares its address)."""
        with self._lock:
            self._connected()
            return [
                str(info["NodeManagerAddress"])
                for info in _ray_nodes()
                if info.get("Alive") and info.get("NodeManagerAddress")
            ]

    # --- a trial's folders (TrialFiles) ---

    def _trial_folder(self, trial_id: int) -> Path:
        return checkpoint_dir(self._checkpoint_root, self._node_work_dir, self.namespace, trial_id)

    def freeze_trial_files(self, trial_id: int) -> None:
        """Make the trial's checkpoint folder read-only (it passed its storage quota)."""
        freeze_folder(self._trial_folder(trial_id))

    def discard_trial_files(self, trial_id: int) -> None:
        """Remove the ended trial's checkpoint folder (its checkpoints are in the store).

        The folder lives under the storage root the control plane gave the nodes (shared by
        them on a cluster); a node-local folder (no storage root) goes with the node's work
        folder.
        """
        discard_folder(self._trial_folder(trial_id))

    def trial_event_files(self, trial_id: int, max_bytes: int) -> dict[str, bytes]:
        """TensorBoard event files the trial wrote in its checkpoint folder, where this host
        reads it (the storage root's folder; none where it stays on a node: a bucket)."""
        return event_files(self._trial_folder(trial_id), max_bytes)

    # --- sessions (SessionEndpoints) ---

    def _home(self, home_key: str) -> Path:
        """A user's session home: beside the trials' folders under the storage root."""
        parts = Path(home_key).parts
        if not parts or any(p in ("..", "/") for p in parts):
            raise ValueError(f"not a home key: {home_key!r}")
        trials = checkpoint_dir(self._checkpoint_root, self._node_work_dir, self.namespace, 0)
        return trials.parent.parent / "session-homes" / home_key

    def session_endpoint(self, attempt_key: str) -> SessionEndpoint | None:
        """How the control plane reaches the attempt's session server, as rank 0's actor says
        (ADR 0041): its socket directly when the actor runs on this control plane's own Ray
        node (and ``session_relay`` is ``auto``), else the relay the actor serves on its node's
        address. None until the server made its socket, or while the actor does not answer."""
        known = self._endpoints.get(attempt_key)
        if known is not None:
            return known
        with self._lock:
            self._connected()
            actor = self._actor(attempt_key, 0, self._attempts.get(attempt_key))
        if actor is None:
            return None
        try:
            info = ray.get(actor.session_relay.remote(), timeout=max(2.0, self._poll_timeout_s * 4))
        except Exception:  # the actor is gone or busy: the next request asks again
            return None
        if not info or not info.get("ready"):
            return None
        socket = str(info["socket"])
        endpoint = SessionEndpoint(socket, (str(info["host"]), int(info["port"])), info["secret"])
        here = self.session_relay == "auto" and info.get("node_id") == self._own_node_id()
        if here and Path(socket).is_socket():  # this host: no hop through the relay
            endpoint = SessionEndpoint(socket)
        if len(self._endpoints) > 1024:
            self._endpoints.clear()
        self._endpoints[attempt_key] = endpoint
        return endpoint

    def _own_node_id(self) -> str | None:
        try:
            return str(ray.get_runtime_context().get_node_id())
        except Exception:
            return None

    # --- attempts ---

    def launch(self, launch: AttemptLaunch) -> None:
        """Create the placement group and the rank actors; the actors start the ranks."""
        world_size = len(launch.placement)
        if world_size < 1:
            raise ValueError(f"attempt {launch.attempt_key}: placement names no rank")
        if not launch.argv:
            raise ValueError(f"attempt {launch.attempt_key}: empty entrypoint")
        key = launch.attempt_key
        with self._lock:
            self._connected()
            if self.warm_pool_size:
                self._ensure_warm_pools()  # a node that joined since gets its pool
            cached = self._attempts.pop(key, None)  # trust Ray, not a cache another may outdate
            if self._find_pg(key) is not None or self._actor(key, 0, None) is not None:
                if cached is not None:
                    self._attempts[key] = cached
                raise Conflict(f"attempt {key} already exists on the cluster")
            bundle: dict[str, float] = {"CPU": launch.cpus_per_worker}
            if launch.gpus_per_worker:
                bundle["GPU"] = launch.gpus_per_worker
            if launch.memory_gb_per_worker:
                bundle["memory"] = int(launch.memory_gb_per_worker * _GiB)
            selectors = self._label_selectors(launch)
            pg = placement_group(
                [dict(bundle) for _ in range(world_size)],
                strategy=_STRATEGIES.get(launch.strategy, "PACK"),
                name=key,
                lifetime="detached",  # outlives the control plane, like the actors in it
                bundle_label_selector=selectors,
            )
            attempt = _Attempt(pg=pg, world_size=world_size)
            # small archives travel inside the creation task (saves a fetch from the object
            # store); big ones go to the object store once for every rank
            archive = launch.context_archive
            # one secret per attempt: the runtime's rendezvous keys live under it
            launch = dataclasses.replace(
                launch, env={**launch.env, RENDEZVOUS_SECRET_ENV: secrets.token_hex(16)}
            )
            context: Any = archive if len(archive) <= _INLINE_ARCHIVE_BYTES else ray.put(archive)
            hosts = self._ready_hosts(launch, exact=selectors is not None)
            try:
                if hosts is not None:
                    attempt.actors = self._host_ranks(launch, world_size, hosts, context)
                if not attempt.actors:
                    for rank in range(world_size):
                        attempt.actors[rank] = self._create_rank_actor(
                            launch, rank, world_size, pg, bundle, context
                        )
            except Exception as exc:
                for actor in attempt.actors.values():
                    _kill(actor)
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
                if isinstance(exc, ray.exceptions.ActorAlreadyExistsError):
                    raise Conflict(f"attempt {key}: {exc}") from exc
                raise
            self._attempts[key] = attempt

    def _host_ranks(
        self, launch: AttemptLaunch, world_size: int, hosts: Mapping[str, Any], context: Any
    ) -> dict[int, Any]:
        """Hand every rank to the rank host of its node (rank_host.py); {} when one of them
        cannot take it (the ranks then get actors of their own)."""
        started: dict[int, Any] = {}
        refs = []
        for rank in range(world_size):
            host = hosts[launch.placement[rank]]
            spec = self._rank_spec(launch, rank, world_size, hosted=True)
            refs.append(host.start.remote(spec, context))
            started[rank] = rank_host.HostedRank(host, actor_name(launch.attempt_key, rank))
        try:
            ray.get(refs, timeout=10.0)
        except Exception:
            logger.exception("attempt %s: the rank hosts refused it", launch.attempt_key)
            for handle in started.values():
                handle.drop()
            return {}
        return started

    def _rank_spec(
        self, launch: AttemptLaunch, rank: int, world_size: int, *, hosted: bool = False
    ) -> RankSpec:
        return RankSpec(
            attempt_key=launch.attempt_key,
            namespace=self.namespace,
            rank=rank,
            world_size=world_size,
            argv=tuple(launch.argv),
            env=dict(launch.env),
            fail_fast_grace_s=self._fail_fast_grace_s,
            node_work_dir=self._node_work_dir,
            trial_id=launch.trial_id,
            sandbox=self.sandbox,
            checkpoint_root=self._checkpoint_root,
            data_dir=self._data_dir,
            denied=self._denied,
            environment_dir=launch.environment_dir,
            environment_key=launch.environment_key,
            environment_cache=self._env_cache,
            dataset_cache_dir=self._dataset_cache_dir,
            dataset_cache_bytes=self._dataset_cache_bytes,
            home_dir=str(self._home(launch.home_key)) if launch.home_key else None,
            resources=TrialResources(
                cpus_per_worker=launch.cpus_per_worker,
                memory_gb_per_worker=launch.memory_gb_per_worker,
                pin_cpus=launch.pin_cpus,
            )
            if self.isolation is not None
            else None,
            isolation=self.isolation,
            hosted=hosted,
        )

    def _create_rank_actor(
        self,
        launch: AttemptLaunch,
        rank: int,
        world_size: int,
        pg: PlacementGroup,
        bundle: Mapping[str, float],
        context: Any,
    ) -> Any:
        spec = self._rank_spec(launch, rank, world_size)
        return _RankWorkerActor.options(
            name=actor_name(launch.attempt_key, rank),
            namespace=self.namespace,
            lifetime="detached",
            max_restarts=0,
            max_task_retries=0,
            num_cpus=launch.cpus_per_worker,
            num_gpus=launch.gpus_per_worker,
            memory=bundle.get("memory"),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=rank
            ),
        ).remote(spec, context)

    def poll(self, attempt_key: str, log_offsets: Mapping[int, int]) -> AttemptStatus:
        with self._lock:
            self._connected()
            attempt = self._attempt(attempt_key)
            if attempt is None:
                if self._actor(attempt_key, 0, None) is not None:
                    return AttemptStatus(
                        attempt_key, AttemptPhase.LOST, detail="placement group is gone"
                    )
                return AttemptStatus(attempt_key, AttemptPhase.UNKNOWN, detail="not on Ray")
            state = _pg_state(attempt.pg)
            if state == "REMOVED":
                return AttemptStatus(
                    attempt_key, AttemptPhase.LOST, detail="placement group was removed"
                )
            if state == "PENDING":  # never placed yet (RESCHEDULING: placed, lost a node)
                ranks = tuple(RankStatus(r, RankPhase.STARTING) for r in range(attempt.world_size))
                detail = "placement group pending: waiting for resources"
                return AttemptStatus(attempt_key, AttemptPhase.PLACING, ranks, detail)
            polled = self._poll_ranks(attempt_key, attempt, log_offsets)
            return _aggregate(attempt_key, polled, attempt.lost_reasons)

    def terminate(self, attempt_key: str, grace_s: float = 10.0) -> None:
        """Ask every rank to SIGTERM its process tree (SIGKILL after ``grace_s``, on the node).

        Returns once the ranks acknowledged (or after a short wait); it does not wait for the
        processes to end: poll until the attempt is EXITED.
        """
        with self._lock:
            self._connected()
            attempt = self._attempt(attempt_key)
            world_size = attempt.world_size if attempt else 0
            refs = []
            for rank in range(world_size):
                actor = self._actor(attempt_key, rank, attempt)
                if actor is not None:
                    refs.append(actor.terminate.remote(grace_s))
            # actors of a pending placement group answer only once placed: do not wait for them
            placed = attempt is not None and _pg_state(attempt.pg) != "PENDING"
            _wait_quietly(refs, timeout_s=2.0 if placed else 0.0)

    def release(self, attempt_key: str) -> None:
        with self._lock:
            self._connected()
            attempt = self._attempt(attempt_key)
            ranks = {int(m["rank"]) for m in self._named_actors() if m["key"] == attempt_key}
            if attempt is not None:
                ranks.update(range(attempt.world_size))
            actors = [
                a for r in sorted(ranks) if (a := self._actor(attempt_key, r, attempt)) is not None
            ]
            if attempt is not None and _pg_state(attempt.pg) in ("CREATED", "RESCHEDULING"):
                # kill the process trees and delete the node-local files while the actors live
                _wait_quietly([a.cleanup.remote() for a in actors], timeout_s=5.0)
            for actor in actors:
                _kill(actor)
            if attempt is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(attempt.pg)
            self._attempts.pop(attempt_key, None)
            self._endpoints.pop(attempt_key, None)
            # ray.kill is asynchronous: return once the names are free, so that poll says
            # UNKNOWN and live_attempts leaves the attempt out from now on
            deadline = time.monotonic() + 5.0
            while actors and time.monotonic() < deadline:
                if all(m["key"] != attempt_key for m in self._named_actors()):
                    break
                time.sleep(0.02)

    def live_attempts(self) -> list[str]:
        with self._lock:
            self._connected()
            return sorted({m["key"] for m in self._named_actors()})

    # --- helpers ---

    def _label_selectors(self, launch: AttemptLaunch) -> list[dict[str, str]] | None:
        if not self._exact_placement:
            return None
        alive = {n["NodeID"] for n in _ray_nodes() if n.get("Alive")}
        if not set(launch.placement) <= alive:
            logger.warning(
                "attempt %s: placement names nodes that are not alive; using %s instead",
                launch.attempt_key,
                launch.strategy,
            )
            return None
        return [{NODE_ID_LABEL: node_id} for node_id in launch.placement]

    def _attempt(self, attempt_key: str) -> _Attempt | None:
        attempt = self._attempts.get(attempt_key)
        if attempt is not None:
            return attempt
        pg = self._find_pg(attempt_key)
        if pg is None:
            return None
        attempt = _Attempt(pg=pg, world_size=pg.bundle_count)
        self._attempts[attempt_key] = attempt
        return attempt

    @staticmethod
    def _find_pg(attempt_key: str) -> PlacementGroup | None:
        try:
            found: PlacementGroup = get_placement_group(attempt_key)
            return found
        except ValueError:
            return None

    def _actor(self, attempt_key: str, rank: int, attempt: _Attempt | None) -> Any | None:
        if attempt is not None and rank in attempt.actors:
            return attempt.actors[rank]
        name = actor_name(attempt_key, rank)
        try:
            actor: Any = ray.get_actor(name, namespace=self.namespace)
        except ValueError:  # no such name: never created, or dead (a dead actor frees its name)
            actor = self._hosted(name)
            if actor is None:
                return None
        if attempt is not None:
            attempt.actors[rank] = actor
        return actor

    def _host_actors(self) -> list[Any]:
        """The rank hosts of this namespace (also those a previous control plane started)."""
        hosts = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") == self.namespace and entry.get("name", "").startswith(
                rank_host.HOST_PREFIX
            ):
                with contextlib.suppress(ValueError):
                    hosts.append(ray.get_actor(entry["name"], namespace=self.namespace))
        return hosts

    def _hosted_names(self) -> list[tuple[Any, list[str]]]:
        """Every rank host with the names of the ranks it runs (hosts that answer)."""
        hosts = self._host_actors()
        refs = [h.names.remote() for h in hosts]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)
        found = []
        for host, ref in zip(hosts, refs, strict=True):
            with contextlib.suppress(ray.exceptions.RayError):
                found.append((host, list(ray.get(ref, timeout=0))))
        return found

    def _hosted(self, name: str) -> rank_host.HostedRank | None:
        for host, names in self._hosted_names():
            if name in names:
                return rank_host.HostedRank(host, name)
        return None

    def _named_actors(self) -> list[dict[str, str]]:
        names = [
            entry.get("name", "")
            for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry.get("namespace") == self.namespace
        ]
        names += [name for _, hosted in self._hosted_names() for name in hosted]
        found = []
        for name in names:
            match = _ACTOR_NAME.match(name)
            if match:
                found.append({"key": match["key"], "rank": match["rank"]})
        return found

    def _poll_ranks(
        self, attempt_key: str, attempt: _Attempt, log_offsets: Mapping[int, int]
    ) -> list[RankStatus]:
        pending: dict[int, Any] = {}
        statuses: dict[int, RankStatus] = {}
        for rank in range(attempt.world_size):
            actor = self._actor(attempt_key, rank, attempt)
            if actor is None:
                statuses[rank] = RankStatus(rank, RankPhase.LOST)
                attempt.lost_reasons.setdefault(rank, "its actor is gone")
                continue
            pending[rank] = actor.status.remote(log_offsets.get(rank, 0), MAX_LOG_CHUNK)
        if pending:
            ray.wait(list(pending.values()), num_returns=len(pending), timeout=self._poll_timeout_s)
        for rank, ref in pending.items():
            statuses[rank] = self._rank_status(rank, ref, attempt)
        attempt.last.update(statuses)
        return [statuses[r] for r in range(attempt.world_size)]

    def _rank_status(self, rank: int, ref: Any, attempt: _Attempt) -> RankStatus:
        try:
            report: RankReport = ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:
            # still being created, or busy: keep what we knew, without new output
            last = attempt.last.get(rank)
            if last is None:
                return RankStatus(rank, RankPhase.STARTING)
            return RankStatus(rank, last.phase, last.exit_code, b"", last.node_id)
        except ray.exceptions.RayError as exc:
            # ActorDiedError / ActorUnavailableError / node death: the process state is unknown
            attempt.actors.pop(rank, None)
            reason = _first_sentence(exc)
            attempt.lost_reasons.setdefault(rank, reason)
            logger.info("rank %d lost: %s", rank, reason)
            last = attempt.last.get(rank)
            return RankStatus(rank, RankPhase.LOST, node_id=last.node_id if last else None)
        phase = {RUNNING: RankPhase.RUNNING, EXITED: RankPhase.EXITED}.get(
            report.phase, RankPhase.STARTING
        )
        return RankStatus(
            rank,
            phase,
            report.exit_code,
            report.log_chunk,
            report.node_id,
            getattr(report, "log_size", None),  # an actor of an older version has neither
            tuple(getattr(report, "disk", ())),
            getattr(report, "detail", ""),
            getattr(report, "network", None),
            getattr(report, "hooks_wire_bytes", None),
        )


def connect(address: str, namespace: str) -> int:
    """Connect this process to the Ray cluster unless it is (idempotent, thread-safe).

    Returns a number that changes whenever this call had to (re)connect, e.g. after some other
    code of the process called ``ray.shutdown()``: actor handles of an older connection are void.
    """
    with _Connection.lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().namespace
            if current != namespace:
                raise ExecutorUnavailable(
                    f"this process is connected to Ray in namespace {current!r}, not {namespace!r}",
                    hint="use one namespace per control-plane process",
                )
            return _Connection.number
        _enable_token_auth_if_available()
        try:
            ray.init(
                address=address,
                namespace=namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
            raise ExecutorUnavailable(
                f"cannot connect to the Ray cluster at {address}: {exc}",
                hint="start it (`ray start --head`) or fix the address; with token "
                "authentication the token must be in ~/.ray/auth_token or $RAY_AUTH_TOKEN",
            ) from exc
        _Connection.number += 1
        return _Connection.number


def _enable_token_auth_if_available() -> None:
    """Ray only turns token auth on by itself for clusters it finds, not for an explicit
    address: do what it does for those (RAY_AUTH_MODE set explicitly always wins)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _aggregate(
    attempt_key: str, ranks: list[RankStatus], lost_reasons: Mapping[int, str]
) -> AttemptStatus:
    phases = [r.phase for r in ranks]
    failed = [r for r in ranks if r.phase == RankPhase.EXITED and r.exit_code != 0]
    lost = [r.rank for r in ranks if r.phase == RankPhase.LOST]
    if all(p == RankPhase.EXITED for p in phases):
        phase = AttemptPhase.EXITED
    elif lost:
        phase = AttemptPhase.LOST
    elif all(p == RankPhase.STARTING for p in phases):
        phase = AttemptPhase.PLACING
    else:
        phase = AttemptPhase.RUNNING
    details = [f"rank {r} lost: {lost_reasons.get(r, 'actor or node died')}" for r in lost]
    details.extend(r.detail or f"rank {r.rank} exited with code {r.exit_code}" for r in failed)
    return AttemptStatus(attempt_key, phase, tuple(ranks), "; ".join(details))


def _kill(actor: Any) -> None:
    """End a rank actor (``ray.kill``), or forget a hosted rank on its host."""
    if isinstance(actor, rank_host.HostedRank):
        actor.drop()
        return
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


def _first_sentence(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.split(". ")[0][:300] or type(exc).__name__


def _ray_nodes() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def _pg_state(pg: PlacementGroup) -> str:
    try:
        return str(placement_group_table(pg).get("state", "REMOVED"))
    except Exception:
        return "REMOVED"


def _gpu_model(labels: Mapping[str, str], resources: Mapping[str, float]) -> str | None:
    if labels.get(ACCELERATOR_LABEL):
        return labels[ACCELERATOR_LABEL]
    for name in resources:
        if name.startswith("accelerator_type:"):
            return name.split(":", 1)[1]
    return None


def _wait_quietly(refs: list[Any], timeout_s: float) -> None:
    """Wait for fire-and-forget calls to be done, failures included, at most ``timeout_s``."""
    if not refs:
        return
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(ref, timeout=0)
