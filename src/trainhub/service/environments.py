"""Per-experiment Python environments: checked at submit, built before placement, cached.

An experiment whose spec asks for packages (``environment.requirements`` or
``environment.packages``) gets a venv layered over the platform's environment
(:mod:`trainhub.core.environments` holds the rules; ``adapters/envs/uv.py`` resolves and
installs with uv). The control loop asks :meth:`EnvironmentService.prepare` before it starts
such a trial: the answer is ready (with the venv's path), building (the trial waits in the
queue holding no slot, its pending reason says so) or failed (the trial fails once with the
resolver's message; ADR 0026). Builds run on this service's worker thread, one per request
however many trials wait for it; the builder's file lock makes a second process wait for the
first. Ready environments are evicted least-recently-used past the cache size an admin sets,
never while a queued or running trial needs one.

Where no folder is shared with the nodes (ADR 0034), the control plane only resolves (the
lock is text) and each node that will run a rank installs the environment into its own cache,
once per node (a :class:`NodeInstaller`: a task on that node, under the builder's lock); the
trial waits, holding no slot, until every node of its placement has it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from trainhub.core.environments import (
    MAX_REQUIREMENTS_FILE_BYTES,
    BaseIdentity,
    EnvironmentState,
    check_requirements,
    environment_key,
    layered_packages,
    request_key,
    requirement_lines,
    short_key,
)
from trainhub.core.errors import Conflict, FieldError, InvalidSpec, NotFound
from trainhub.core.spec import ExperimentSpec
from trainhub.service.auth import check_read, require_admin, require_user, visible_tenants
from trainhub.service.clock import Clock
from trainhub.service.context_archive import read_member
from trainhub.service.ports import Principal
from trainhub.service.repository import UnitOfWork

log = logging.getLogger(__name__)
MAX_ERROR_CHARS = 4000  # of the resolver's message kept in a trial's reason
MAX_LOG_CHARS = 200_000  # of the build log kept (nodes append theirs)
NODE_BUILDS_AT_ONCE = 8  # installs on distinct nodes run side by side


@dataclass(frozen=True)
class BaseEnvironment:
    """The platform's environment trial environments are layered over."""

    identity: BaseIdentity
    versions: dict[str, str]  # canonical name -> version of every installed distribution


@dataclass(frozen=True)
class Installed:
    path: str  # the venv, read-only from now on
    size_bytes: int
    built: bool  # False: another builder (process) had installed it already
    log: str


class BuildFailed(Exception):
    """A request did not resolve or install; ``message`` is the tool's own, ``log`` all of it."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.message = message
        self.log = log


class EnvironmentBuilder(Protocol):
    """Port: resolve and install environments on this node (``adapters/envs/uv.py``)."""

    def base(self) -> BaseEnvironment: ...

    def resolve(self, lines: Sequence[str], base: BaseEnvironment) -> tuple[str, str]:
        """The lock of a request and the resolver's log; raises :class:`BuildFailed`."""
        ...

    def install(self, key: str, packages: Sequence[str], base: BaseEnvironment) -> Installed:
        """Install ``packages`` (the lock less the base) as environment ``key``, once: under a
        lock, a second caller waits and finds it installed. Raises :class:`BuildFailed`."""
        ...

    def path(self, key: str) -> str | None:
        """The installed environment's folder, or None when it is not (completely) there."""
        ...

    def remove(self, key: str) -> None: ...


class NodeInstaller(Protocol):
    """Port: install environments on the nodes that run ranks, each node into a cache of its
    own (no folder shared with the control plane; adapters/ray_executor/node_environments.py).
    """

    def install(
        self, node_id: str, key: str, packages: Sequence[str], base: BaseIdentity
    ) -> Installed:
        """Install ``packages`` as environment ``key`` on ``node_id`` and wait: once per node
        (a second caller finds it installed). Raises :class:`BuildFailed` with uv's message
        (or when the node's base is not ``base``), :class:`NodeLost` when the node went away.
        """
        ...

    def remove(self, key: str) -> None:
        """Remove the environment from every live node's cache (best effort)."""
        ...


class NodeLost(Exception):
    """The node went away while it installed: not the environment's fault (built again on
    the node the trial is placed on next)."""


@dataclass(frozen=True)
class EnvironmentRecord:
    """One row of the ``environments`` table: a request and the environment it resolved to."""

    request_key: str
    key: str | None  # the content address (lock + Python + base); None until resolved
    state: EnvironmentState
    requirements: list[str]  # as the experiment asked
    packages: list[str]  # the pins installed over the base
    size_bytes: int
    created_at: float
    built_at: float | None
    last_used_at: float | None
    num_builds: int  # times it was installed (a reused one is not built again)
    num_uses: int  # attempts started with it
    nodes: list[str]
    build_s: float | None
    error: str
    build_log: str


class EnvironmentStore(Protocol):
    """Port: the ``environments`` and ``experiment_environments`` tables (adapters/db)."""

    def get(self, request_key: str) -> EnvironmentRecord | None: ...

    def begin(self, request_key: str, requirements: Sequence[str], now: float) -> None:
        """Insert the request (or set it BUILDING again); keeps its counts."""
        ...

    def finish(
        self,
        request_key: str,
        key: str,
        packages: Sequence[str],
        size_bytes: int,
        build_log: str,
        build_s: float,
        built: bool,
        now: float,
    ) -> None: ...

    def fail(self, request_key: str, error: str, build_log: str, now: float) -> None: ...

    def use(self, request_key: str, nodes: Collection[str], now: float) -> None: ...

    def link(self, experiment_id: int, request_key: str) -> None: ...

    def of_experiment(self, experiment_id: int) -> EnvironmentRecord | None: ...

    def list(self, tenants: Collection[str] | None) -> list[EnvironmentRecord]:
        """Every record (``tenants`` None) or those an experiment of ``tenants`` uses."""
        ...

    def delete(self, request_keys: Collection[str]) -> None: ...

    def in_use(self) -> set[str]:
        """The request keys of experiments with a trial queued, scheduled or running."""
        ...


# ---------------------------------------------------------------- what the loop is told


@dataclass(frozen=True)
class EnvironmentReady:
    path: str | None  # the venv; None: in each node's own cache, under ``record.key``
    record: EnvironmentRecord


@dataclass(frozen=True)
class EnvironmentBuilding:
    reason: str


@dataclass(frozen=True)
class EnvironmentFailed:
    message: str


Readiness = EnvironmentReady | EnvironmentBuilding | EnvironmentFailed


@dataclass
class _Job:
    """One build in flight, and the experiments that wait for it."""

    waiters: set[int] = field(default_factory=set)
    done: bool = False
    error: str | None = None


class EnvironmentService:
    """Environments of experiments: submit checks, builds, the cache and its listing."""

    def __init__(
        self,
        uow: UnitOfWork,
        store: EnvironmentStore,
        builder: EnvironmentBuilder,
        clock: Clock,
        cache_bytes: int | None = None,
        wake: Callable[[], None] = lambda: None,
        nodes: NodeInstaller | None = None,
    ) -> None:
        self.uow = uow
        self.store = store
        self.builder = builder  # resolves; installs too unless ``nodes`` does
        self.nodes = nodes  # None: installed here, into a cache every node reads
        self.clock = clock
        self.cache_bytes = cache_bytes  # None: never evicted
        self.wake = wake  # the control loop, told when a build ends
        self._base: BaseEnvironment | None = None
        self._lock = threading.Lock()
        self._requests: dict[int, tuple[str, list[str]]] = {}  # experiment -> key, lines
        self._jobs: dict[str, _Job] = {}  # request key -> the latest build of it
        # (environment key, node) -> the latest install of it there (``nodes`` only)
        self._node_jobs: dict[tuple[str, str], _Job] = {}
        # one build at a time here; daemon threads: a server that stops does not wait for uv
        self._one_build = threading.Semaphore(1)
        self._node_builds = threading.Semaphore(NODE_BUILDS_AT_ONCE)  # each on its own node

    def base(self) -> BaseEnvironment:
        if self._base is None:
            self._base = self.builder.base()
        return self._base

    # ---------------------------------------------------------------- submit

    def check_request(
        self, spec: ExperimentSpec, context: bytes | BinaryIO | None, files: set[str]
    ) -> None:
        """Refuse (InvalidSpec, 422) what cannot become an environment, at submit."""
        if spec.environment.wants_packages:
            request_lines(spec, context, files, self.base().versions)

    # ---------------------------------------------------------------- the control loop

    def prepare(
        self,
        experiment_id: int,
        spec: ExperimentSpec,
        context: Callable[[], bytes | None],
        nodes: Collection[str] = (),
    ) -> Readiness:
        """Whether a trial of the experiment can start now, on ``nodes`` (its placement), and
        in which environment.

        Cheap when asked again (every tick a trial waits): the request is computed once per
        experiment, a build runs once per request, and (with a :class:`NodeInstaller`) an
        install once per node.
        """
        with self._lock:
            known = self._requests.get(experiment_id)
        if known is None:
            try:
                archive = context() if spec.environment.requirements else None
                lines = request_lines(spec, archive, None, self.base().versions)
            except InvalidSpec as exc:  # the base changed since submit: say what
                return EnvironmentFailed(str(exc))
            known = (request_key(lines, self.base().identity), lines)
            self.store.link(experiment_id, known[0])
            with self._lock:
                self._requests[experiment_id] = known
        key, lines = known
        record = self.store.get(key)
        if record is not None and record.state == EnvironmentState.READY and record.key:
            if self.nodes is not None:
                return self._on_nodes(experiment_id, record, lines, nodes)
            path = self.builder.path(record.key)
            if path is not None:
                return EnvironmentReady(path, record)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.done and job.error is not None:
                if experiment_id in job.waiters:
                    return EnvironmentFailed(job.error)
                job = None  # a new experiment asks again: the index may answer now
            if job is None or job.done:
                job = _Job()
                self._jobs[key] = job
                threading.Thread(
                    target=self._build,
                    args=(key, lines, job),
                    name=f"trainhub-env-{short_key(key)}",
                    daemon=True,
                ).start()
            job.waiters.add(experiment_id)
        return EnvironmentBuilding(_building(key, lines))

    def _on_nodes(
        self,
        experiment_id: int,
        record: EnvironmentRecord,
        lines: Sequence[str],
        nodes: Collection[str],
    ) -> Readiness:
        """Ready once every node of the placement has installed the resolved environment;
        the installs missing are started (one per node however many trials wait)."""
        assert self.nodes is not None
        assert record.key is not None
        missing: list[str] = []
        with self._lock:
            for node in sorted(set(nodes)):
                job = self._node_jobs.get((record.key, node))
                if job is not None and job.done:
                    if job.error is None:
                        continue
                    if experiment_id in job.waiters:
                        return EnvironmentFailed(job.error)
                    job = None  # a new experiment asks again: the index may answer now
                if job is None:
                    job = _Job()
                    self._node_jobs[(record.key, node)] = job
                    threading.Thread(
                        target=self._install_on_node,
                        args=(record, node, job),
                        name=f"trainhub-env-{short_key(record.key)}-{node[:8]}",
                        daemon=True,
                    ).start()
                job.waiters.add(experiment_id)
                missing.append(node)
        if not missing:
            return EnvironmentReady(None, record)
        where = f"node {missing[0][:12]}" if len(missing) == 1 else f"{len(missing)} nodes"
        return EnvironmentBuilding(f"{_building(record.request_key, lines)} on {where}")

    def building(self) -> list[str]:
        """The request keys (and environment keys installing on a node) in flight here."""
        with self._lock:
            return [key for key, job in self._jobs.items() if not job.done] + [
                key for (key, _node), job in self._node_jobs.items() if not job.done
            ]

    def used(self, ready: EnvironmentReady, nodes: Collection[str]) -> None:
        """An attempt starts with the environment (its last use, its nodes)."""
        self.store.use(ready.record.request_key, sorted(set(nodes)), self.clock())

    def _build(self, key: str, lines: list[str], job: _Job) -> None:
        with self._one_build:
            self._build_one(key, lines, job)

    def _build_one(self, key: str, lines: list[str], job: _Job) -> None:
        started = time.monotonic()
        error: str | None = None
        try:
            self.store.begin(key, lines, self.clock())
            base = self.base()
            lock, resolve_log = self.builder.resolve(lines, base)
            env_key = environment_key(lock, base.identity)
            packages = layered_packages(lock, base.versions)
            if self.nodes is None:
                installed = self.builder.install(env_key, packages, base)
            else:  # resolved only: each node installs it when a trial is placed there
                installed = Installed("", 0, False, "")
            self.store.finish(
                key,
                env_key,
                packages,
                installed.size_bytes,
                f"{resolve_log}\n{installed.log}".strip(),
                time.monotonic() - started,
                installed.built,
                self.clock(),
            )
            log.info("environment %s resolved (%s)", short_key(env_key), ", ".join(lines))
        except BuildFailed as exc:
            error = exc.message[-MAX_ERROR_CHARS:]
            self._record_failure(key, error, exc.log)
        except Exception as exc:  # the server stays up; the trials say why
            log.exception("building environment %s failed", short_key(key))
            error = f"{type(exc).__name__}: {exc}"[-MAX_ERROR_CHARS:]
            self._record_failure(key, error, error)
        if error is None:
            self._evict_quietly()
        with self._lock:
            job.error, job.done = error, True
        self.wake()

    def _install_on_node(self, record: EnvironmentRecord, node: str, job: _Job) -> None:
        assert self.nodes is not None
        assert record.key is not None
        error: str | None = None
        retry = False
        with self._node_builds:
            started = time.monotonic()
            try:
                installed = self.nodes.install(
                    node, record.key, record.packages, self.base().identity
                )
                if installed.built:  # counted and sized once per node that built it
                    built_log = f"{record.build_log}\n[node {node[:12]}]\n{installed.log}"
                    self.store.finish(
                        record.request_key,
                        record.key,
                        record.packages,
                        installed.size_bytes,
                        built_log.strip()[-MAX_LOG_CHARS:],
                        time.monotonic() - started,
                        True,
                        self.clock(),
                    )
                    log.info("environment %s built on node %s", short_key(record.key), node)
            except BuildFailed as exc:
                error = f"on node {node[:12]}: {exc.message}"[-MAX_ERROR_CHARS:]
                self._record_failure(record.request_key, error, exc.log)
            except NodeLost as exc:  # the next placement avoids the node: install there
                log.warning("environment %s on node %s: %s", short_key(record.key), node, exc)
                retry = True
            except Exception as exc:  # the server stays up; the trials say why
                log.exception("installing environment %s on %s failed", record.key, node)
                error = f"on node {node[:12]}: {type(exc).__name__}: {exc}"[-MAX_ERROR_CHARS:]
                self._record_failure(record.request_key, error, error)
        with self._lock:
            job.error, job.done = error, True
            if retry and self._node_jobs.get((record.key, node)) is job:
                del self._node_jobs[(record.key, node)]
            if error is not None:  # the request failed (its record says so): its waiters fail
                self._jobs[record.request_key] = _Job(set(job.waiters), True, error)
        self.wake()

    def _record_failure(self, key: str, error: str, build_log: str) -> None:
        try:
            self.store.fail(key, error, build_log, self.clock())
        except Exception:
            log.exception("recording the failure of environment %s failed", short_key(key))

    # ---------------------------------------------------------------- the cache

    def evict(self) -> list[EnvironmentRecord]:
        """Remove ready environments, least recently used first, until the cache fits."""
        if self.cache_bytes is None:
            return []
        records = [r for r in self.store.list(None) if r.state == EnvironmentState.READY and r.key]
        sizes = {r.key: r.size_bytes for r in records}
        total = sum(sizes.values())
        if total <= self.cache_bytes:
            return []
        busy = self.store.in_use()
        busy_keys = {r.key for r in records if r.request_key in busy}
        removed: list[EnvironmentRecord] = []
        for record in sorted(records, key=lambda r: r.last_used_at or r.built_at or 0.0):
            if total <= self.cache_bytes:
                break
            key = record.key
            if key is None or key in busy_keys or key not in sizes:
                continue
            total -= sizes.pop(key)
            removed += self._remove_key(key, records)
        return removed

    def _evict_quietly(self) -> None:
        try:
            for record in self.evict():
                log.info("evicted environment %s (cache full)", short_key(record.key or ""))
        except Exception:
            log.exception("evicting environments failed")

    def _remove_key(
        self, key: str, records: Sequence[EnvironmentRecord]
    ) -> list[EnvironmentRecord]:
        gone = [r for r in records if r.key == key]
        self._remove_installed(key)
        self.store.delete([r.request_key for r in gone])
        return gone

    def _remove_installed(self, key: str) -> None:
        """Remove the environment's folder here, or from every node's cache."""
        if self.nodes is None:
            self.builder.remove(key)
            return
        with self._lock:
            for pair in [p for p in self._node_jobs if p[0] == key]:
                del self._node_jobs[pair]
        self.nodes.remove(key)

    # ---------------------------------------------------------------- users and admins

    def list_environments(self, principal: Principal) -> list[EnvironmentRecord]:
        """The cached environments: all for admins, those of visible experiments otherwise."""
        require_user(principal)
        tenants = visible_tenants(principal)
        return self.store.list(None if tenants is None else set(tenants))

    def remove(self, principal: Principal, key_prefix: str) -> list[EnvironmentRecord]:
        """Delete an environment (admins); refused while a queued or running trial needs it."""
        require_admin(principal)
        records = self.store.list(None)
        prefix = key_prefix.strip().lower()
        matches = {
            r.key or r.request_key
            for r in records
            if len(prefix) >= 6
            and ((r.key or "").startswith(prefix) or r.request_key.startswith(prefix))
        }
        if not matches:
            raise NotFound(f"no environment {key_prefix!r}", "list them with `trainhub envs`")
        if len(matches) > 1:
            raise Conflict(f"{key_prefix!r} names {len(matches)} environments: give more digits")
        (key,) = matches
        chosen = [r for r in records if (r.key or r.request_key) == key]
        busy = self.store.in_use()
        if any(r.request_key in busy for r in chosen):
            raise Conflict(
                f"environment {short_key(key)} is used by a queued or running trial",
                "remove it once its trials have ended",
            )
        if chosen[0].key:
            self._remove_installed(chosen[0].key)
        self.store.delete([r.request_key for r in chosen])
        with self._lock:
            for record in chosen:
                self._jobs.pop(record.request_key, None)
        return chosen

    def of_trial(self, principal: Principal, trial_id: int) -> EnvironmentRecord:
        """The environment a trial runs in, with its build log (``trainhub logs T --env``)."""
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_read(principal, trial.tenant, f"trial {trial_id}")
        record = self.store.of_experiment(trial.experiment_id)
        if record is None:
            raise NotFound(
                f"trial {trial_id} runs in the platform's environment (its spec asks for no "
                "packages), or its environment was not prepared yet"
            )
        return record

    def close(self) -> None:
        """Nothing to release: builds in flight end by themselves (their threads are daemons)."""


def _building(key: str, lines: Sequence[str]) -> str:
    """The pending reason of a trial whose environment is being built."""
    what = ", ".join(lines[:3]) + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")
    return f"building its environment {short_key(key)} ({what})"


def request_lines(
    spec: ExperimentSpec,
    context: bytes | BinaryIO | None,
    files: set[str] | None,
    base_versions: dict[str, str],
) -> list[str]:
    """The requirement lines of a spec (its file's and its packages), checked; InvalidSpec
    names the field of each problem."""
    lines: list[str] = []
    errors: list[FieldError] = []
    name = spec.environment.requirements
    if name is not None:
        present = files is None or name in files
        content = read_member(context, name, MAX_REQUIREMENTS_FILE_BYTES) if context else None
        if not present or content is None:
            raise InvalidSpec(
                [
                    FieldError(
                        "environment.requirements",
                        f"the file {name!r} is not in the submitted code",
                        "submit the directory that holds it (trainhub submit SPEC -C DIR), or "
                        "fix the path relative to that directory",
                    )
                ]
            )
        if len(content) > MAX_REQUIREMENTS_FILE_BYTES:
            raise InvalidSpec(
                [
                    FieldError(
                        "environment.requirements",
                        f"{name!r} is larger than {MAX_REQUIREMENTS_FILE_BYTES // 1024} KiB",
                    )
                ]
            )
        file_lines = requirement_lines(content.decode("utf-8", errors="replace"))
        errors += [
            FieldError(e.path, f"{name}: {e.message}", e.hint)
            for e in check_requirements(file_lines, "environment.requirements", base_versions)
        ]
        lines += file_lines
    packages = [p.strip() for p in spec.environment.packages]
    errors += check_requirements(packages, "environment.packages", base_versions)
    lines += packages
    if errors:
        raise InvalidSpec(errors)
    if not lines:
        raise InvalidSpec(
            [
                FieldError(
                    "environment.requirements",
                    f"{name!r} lists no package",
                    "list one package per line, or drop environment.requirements",
                )
            ]
        )
    return lines
