"""Interactive sessions: notebooks, shells and TensorBoard as trials (docs/sessions.md).

A session is an experiment of the project ``sessions`` whose spec has a ``session`` section
and whose entrypoint is ``python -m trainhub.runtime.session_server``: the scheduler queues,
places, preempts and accounts it like any trial; the control loop adds the session's secret,
base URL and the owner's persistent home at launch (:meth:`SessionService.launch_env`). The
proxy (api/session_proxy.py) asks :meth:`SessionService.upstream` on every request who may
reach it: the owner, the tenant's admins and cluster admins; the idle rule
(core/session_spec.py) ends a session nobody uses (:meth:`SessionService.cull_idle`).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import tarfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from trainhub.core.errors import FieldError, InvalidSpec, NotFound, TrainhubError
from trainhub.core.session_spec import (
    BASE_URL_ENV,
    IDLE_CHECK_INTERVAL_S,
    KIND_ENV,
    SECRET_ENV,
    SESSION_PROJECT,
    Activity,
    SessionKind,
    SessionLimits,
    SessionSpec,
    gpu_errors,
    idle_verdict,
)
from trainhub.core.states import TrialState
from trainhub.service.auth import check_read, choose_tenant, require_admin, require_user
from trainhub.service.clock import Clock
from trainhub.service.experiments import ExperimentService
from trainhub.service.ports import Principal, SessionEndpoint, SessionEndpoints
from trainhub.service.records import Experiment, Trial
from trainhub.service.repository import UnitOfWork

log = logging.getLogger(__name__)

ENTRYPOINT = "python -m trainhub.runtime.session_server"
ROUTE_TTL_S = 2.0
PROXY_PREFIX = "/ui/sessions"  # the dashboard's cookie reaches it (its path is /ui)
_LANDING = {SessionKind.NOTEBOOK: "lab", SessionKind.SHELL: "lab", SessionKind.TENSORBOARD: ""}


def base_url(session_id: int) -> str:
    """The path prefix the session's server serves (and the proxy forwards) under."""
    return f"{PROXY_PREFIX}/{session_id}/server/"


def home_key(tenant: str, owner: str) -> str:
    """The owner's session home, kept across sessions (the executor places it)."""
    return f"tenant-{tenant}/user-{owner}"


class SessionLimitStore(Protocol):
    def session_limits(self, tenant: str) -> SessionLimits: ...
    def set_session_limits(self, tenant: str, limits: SessionLimits) -> None: ...


class SessionProbe(Protocol):
    """Asks a session's server how it is used (jupyter-server's /api/status)."""

    def activity(
        self, endpoint: SessionEndpoint, secret: str, base: str
    ) -> tuple[float | None, int] | None:
        """(last activity as unix seconds, open kernel connections); None: no answer."""
        ...


class SessionRelayPort(Protocol):
    """The proxy's I/O (adapters/session_proxy.py): requests and WebSockets to a socket."""

    async def http(
        self,
        endpoint: SessionEndpoint,
        secret: str,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], AsyncIterator[bytes], Any]: ...

    async def websocket(
        self,
        endpoint: SessionEndpoint,
        secret: str,
        target: str,
        host: str,
        headers: Iterable[tuple[str, str]],
        subprotocols: list[str],
    ) -> Any: ...

    async def pump(self, receive_client: Any, send_client: Any, upstream: Any) -> None: ...


@dataclass(frozen=True)
class SessionRequest:
    """What ``trainhub notebook``/``shell``/``tensorboard`` and the dashboard ask for."""

    kind: SessionKind = SessionKind.NOTEBOOK
    gpus: int = 0
    idle_timeout_s: float | None = None
    data: tuple[str, ...] = ()  # NAME[:MOUNT] or NAME@VERSION:MOUNT
    requirements: str | None = None  # a requirements file's text (its own environment)
    trials: tuple[int, ...] = ()  # tensorboard: the trials it shows
    tenant: str | None = None
    preemptible: bool = False


@dataclass(frozen=True)
class Upstream:
    """Where the proxy sends one session's requests, and the secret it adds to them."""

    session_id: int
    endpoint: SessionEndpoint  # its socket on this host, or its node's relay
    secret: str


@dataclass(frozen=True)
class SessionView:
    id: int
    tenant: str
    owner: str
    kind: str
    gpus: int
    state: str  # the trial's state
    node: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    idle_s: float | None
    idle_timeout_s: float
    url: str
    trial_id: int | None
    message: str | None


@dataclass
class _Use:
    last_request_at: float = 0.0
    open_connections: int = 0


@dataclass
class ActivityBook:
    """What the proxy saw of each session: its last request and its open WebSockets."""

    _uses: dict[int, _Use] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def touch(self, session_id: int, now: float) -> None:
        with self._lock:
            self._uses.setdefault(session_id, _Use()).last_request_at = now

    def opened(self, session_id: int, now: float) -> None:
        with self._lock:
            use = self._uses.setdefault(session_id, _Use())
            use.open_connections += 1
            use.last_request_at = now

    def closed(self, session_id: int, now: float) -> None:
        with self._lock:
            use = self._uses.setdefault(session_id, _Use())
            use.open_connections = max(0, use.open_connections - 1)
            use.last_request_at = now

    def get(self, session_id: int) -> tuple[float, int]:
        with self._lock:
            use = self._uses.get(session_id, _Use())
            return use.last_request_at, use.open_connections


def session_spec_yaml(
    request: SessionRequest, owner: str, idle_timeout_s: float, has_requirements: bool
) -> str:
    data = []
    for index, item in enumerate(request.data):
        name, _, mount = item.partition(":")
        if not name or not mount:
            raise InvalidSpec(
                [
                    FieldError(
                        f"data[{index}]",
                        f"{item!r} is not NAME:/MOUNT",
                        "e.g. --data mnist:/data/mnist (trainhub data ls lists them)",
                    )
                ]
            )
        name, _, version = name.partition("@")
        mount_entry: dict[str, Any] = {"name": name, "mount": mount}
        if version:
            mount_entry["version"] = int(version) if version.isdigit() else version
        data.append(mount_entry)
    spec: dict[str, Any] = {
        "name": f"{request.kind.value}-{owner}"[:63],
        "project": SESSION_PROJECT,
        "entrypoint": ENTRYPOINT,
        "resources": {"workers": 1, "gpus_per_worker": request.gpus},
        "max_restarts": 0,
        "preemption": {"preemptible": request.preemptible},
        "session": {
            "kind": request.kind.value,
            "idle_timeout_s": idle_timeout_s,
            "trials": list(request.trials),
        },
    }
    if data:
        spec["data"] = data
    if has_requirements:
        spec["environment"] = {"requirements": "requirements.txt"}
    return yaml.safe_dump(spec, sort_keys=False)


def _archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class SessionService:
    """Args:
    key: the control plane's secret for sessions; each session's server secret is derived
        from it and the session's id, so it is never stored (server.py keeps it in its home).
    endpoints: where a session's server listens (the executor); None: no session is reachable.
    probe: asks a server how it is used; None: only the proxy's own record counts.
    tensorboard_files: event files of trials for a tensorboard session (path -> bytes).
    """

    def __init__(
        self,
        uow: UnitOfWork,
        limits: SessionLimitStore,
        experiments: ExperimentService,
        clock: Clock,
        key: bytes,
        endpoints: SessionEndpoints | None = None,
        probe: SessionProbe | None = None,
        tensorboard_files: Callable[[Sequence[int]], dict[str, bytes]] | None = None,
        default_idle_timeout_s: float | None = None,
        relay: SessionRelayPort | None = None,
    ) -> None:
        self.uow = uow
        self.limits = limits
        self.experiments = experiments
        self.clock = clock
        self._key = key
        self.endpoints = endpoints
        self.probe = probe
        self.tensorboard_files = tensorboard_files
        self.default_idle_timeout_s = default_idle_timeout_s
        self.activity = ActivityBook()
        self.relay = relay  # the proxy's I/O; None: sessions are not reachable
        self.cull_interval_s = IDLE_CHECK_INTERVAL_S
        # session id -> (when, its experiment, its server's endpoint): the proxy's lookups
        self._routes: dict[int, tuple[float, Experiment, SessionEndpoint]] = {}
        self._culled_at = 0.0

    # --- secrets and launches (the control loop) ---

    def secret(self, session_id: int) -> str:
        return hmac.new(self._key, f"session-{session_id}".encode(), hashlib.sha256).hexdigest()

    def launch_env(self, experiment_id: int) -> tuple[dict[str, str], str | None]:
        """What a session's attempt gets besides a trial's: its secret, kind and base URL, and
        the owner's home (None: not a session)."""
        with self.uow() as repo:
            experiment = repo.get_experiment(experiment_id)
        raw = experiment.spec.get("session") if experiment else None
        if experiment is None or not raw:
            return {}, None
        kind = SessionSpec.model_validate(raw).kind
        env = {
            SECRET_ENV: self.secret(experiment.id),
            KIND_ENV: kind.value,
            BASE_URL_ENV: base_url(experiment.id),
        }
        return env, home_key(experiment.tenant, experiment.owner)

    # --- use cases ---

    def start(self, principal: Principal, request: SessionRequest) -> SessionView:
        """Submit the session as an experiment; the scheduler starts it like a trial."""
        tenant = choose_tenant(principal, request.tenant)
        limits = self.limits.session_limits(tenant)
        with self.uow() as repo:
            record = repo.get_tenant(tenant)
        errors = gpu_errors(request.gpus, limits, record.limit_slots if record else None)
        if errors:
            raise InvalidSpec(errors)
        if request.kind == SessionKind.TENSORBOARD and not request.trials:
            raise InvalidSpec(
                [FieldError("trials", "tensorboard needs an experiment or trial to show", "")]
            )
        timeout = request.idle_timeout_s or self.default_idle_timeout_s
        files: dict[str, bytes] = {}
        if request.requirements is not None:
            files["requirements.txt"] = request.requirements.encode()
        if request.kind == SessionKind.TENSORBOARD:
            for trial_id in request.trials:  # each must be one the user may read
                self.experiments.get_trial(principal, trial_id)
            if self.tensorboard_files is not None:
                files.update(self.tensorboard_files(request.trials))
        spec = session_spec_yaml(
            request,
            principal.username,
            timeout if timeout is not None else SessionSpec().idle_timeout_s,
            request.requirements is not None,
        )
        detail = self.experiments.submit(
            principal, spec, _archive(files) if files else None, tenant
        )
        return self.get(principal, detail.experiment.id)

    def list_sessions(self, principal: Principal, include_ended: bool = False) -> list[SessionView]:
        require_user(principal)
        experiments, _ = self.experiments.list_experiments(
            principal, None, 200, 0, project=SESSION_PROJECT
        )
        views = [self._view(e) for e in experiments if e.spec.get("session")]
        return [v for v in views if include_ended or v.ended_at is None]

    def get(self, principal: Principal, session_id: int) -> SessionView:
        detail = self.experiments.get(principal, session_id)
        if not detail.experiment.spec.get("session"):
            raise NotFound(f"session {session_id} does not exist", "trainhub sessions lists them")
        return self._view(detail.experiment, detail.trials)

    def stop(self, principal: Principal, session_id: int) -> SessionView:
        self._owned(principal, session_id)
        self.experiments.cancel_experiment(principal, session_id)
        return self.get(principal, session_id)

    def upstream(self, principal: Principal, session_id: int) -> Upstream:
        """Where the proxy sends a request of ``principal`` for this session.

        Only the owner, the tenant's admins and cluster admins pass; anyone else (another
        tenant, a trial's token) is told the session does not exist. The caller is checked on
        every request; where a serving session's socket is is remembered for
        ``ROUTE_TTL_S`` (a JupyterLab page load makes about a hundred requests).
        """
        now = self.clock()
        cached = self._routes.get(session_id)
        if cached is not None and now - cached[0] < ROUTE_TTL_S:
            _, known, path = cached
            self._allow(principal, known, session_id)
            return Upstream(known.id, path, self.secret(known.id))
        experiment, trial = self._owned(principal, session_id)
        endpoint: SessionEndpoint | None = None
        if trial is not None and trial.state == TrialState.RUNNING and self.endpoints:
            with self.uow() as repo:
                attempt = repo.open_attempt(trial.id)
            if attempt is not None:
                endpoint = self.endpoints.session_endpoint(attempt.key)
        if endpoint is None:
            self._routes.pop(session_id, None)
            state = trial.state.value if trial else "unknown"
            raise SessionNotReady(
                f"session {session_id} is not serving ({state})",
                "wait until trainhub sessions shows it RUNNING",
            )
        self._routes[session_id] = (now, experiment, endpoint)
        return Upstream(experiment.id, endpoint, self.secret(experiment.id))

    def check_access(self, principal: Principal, session_id: int) -> None:
        """Raise NotFound unless ``principal`` may use the session (as the proxy lets in)."""
        self._owned(principal, session_id)

    def set_limits(self, principal: Principal, tenant: str, limits: SessionLimits) -> None:
        require_admin(principal)
        with self.uow() as repo:
            if repo.get_tenant(tenant) is None:
                raise NotFound(f"tenant {tenant!r} does not exist")
        self.limits.set_session_limits(tenant, limits)

    def get_limits(self, principal: Principal, tenant: str) -> SessionLimits:
        check_read(principal, tenant, f"tenant {tenant!r}")
        return self.limits.session_limits(tenant)

    # --- idle culling (a thread of the server calls it every IDLE_CHECK_INTERVAL_S) ---

    def maybe_cull(self) -> list[int]:
        """:meth:`cull_idle` at most every ``cull_interval_s`` (called after each loop tick)."""
        now = self.clock()
        if now - self._culled_at < self.cull_interval_s:
            return []
        self._culled_at = now
        try:
            return self.cull_idle()
        except Exception:  # a probe or a race with the loop: the next round tries again
            log.exception("culling idle sessions failed")
            return []

    def cull_idle(self) -> list[int]:
        """End the running sessions idle for their timeout or past their tenant's length."""
        culled = []
        now = self.clock()
        with self.uow() as repo:
            running = repo.trials_in_states([TrialState.RUNNING])
            candidates = [(t, repo.get_experiment(t.experiment_id)) for t in running]
        for trial, experiment in candidates:
            if experiment is None or not experiment.spec.get("session"):
                continue
            verdict = self._verdict(experiment, trial, now)
            if verdict is None or not verdict.cull:
                continue
            log.info("session %d ends: %s", experiment.id, verdict.reason)
            self.experiments.stop_trial_as_platform(trial.id, f"session {verdict.reason}")
            culled.append(experiment.id)
        return culled

    # --- helpers ---

    def _verdict(self, experiment: Experiment, trial: Trial, now: float) -> Any:
        spec = SessionSpec.model_validate(experiment.spec["session"])
        if trial.started_at is None:
            return None
        last, connections = self._activity(experiment.id, trial)
        limits = self.limits.session_limits(experiment.tenant)
        return idle_verdict(
            Activity(trial.started_at, last, connections),
            spec.idle_timeout_s,
            now,
            limits.max_length_s,
        )

    def _activity(self, session_id: int, trial: Trial) -> tuple[float | None, int]:
        proxied_at, connections = self.activity.get(session_id)
        last: float | None = proxied_at or None
        if self.probe is not None and self.endpoints is not None:
            with self.uow() as repo:
                attempt = repo.open_attempt(trial.id)
            endpoint = self.endpoints.session_endpoint(attempt.key) if attempt else None
            answer = (
                self.probe.activity(endpoint, self.secret(session_id), base_url(session_id))
                if endpoint
                else None
            )
            if answer is not None:
                server_at, kernel_connections = answer
                if server_at is not None:
                    last = max(last or 0.0, server_at)
                connections = max(connections, kernel_connections)
        return last, connections

    def _owned(self, principal: Principal, session_id: int) -> tuple[Experiment, Trial | None]:
        with self.uow() as repo:
            experiment = repo.get_experiment(session_id)
            trials = [repo.get_trial(t) for t in experiment.trial_ids] if experiment else []
        if experiment is None or not experiment.spec.get("session"):
            raise _missing(session_id)
        self._allow(principal, experiment, session_id)
        trial = next((t for t in trials if t is not None), None)
        return experiment, trial

    @staticmethod
    def _allow(principal: Principal, experiment: Experiment, session_id: int) -> None:
        """The owner, the tenant's admins and cluster admins; never a trial."""
        if principal.trial_id is not None:
            raise _missing(session_id)
        tenant_admin = principal.roles.get(experiment.tenant) == "admin"
        if not (principal.is_admin or tenant_admin or experiment.owner == principal.username):
            raise _missing(session_id)

    def _view(self, experiment: Experiment, trials: Sequence[Trial] | None = None) -> SessionView:
        spec = SessionSpec.model_validate(experiment.spec["session"])
        with self.uow() as repo:
            if trials is None:
                trials = [t for t in (repo.get_trial(i) for i in experiment.trial_ids) if t]
            trial = trials[0] if trials else None
            attempt = repo.open_attempt(trial.id) if trial else None
        now = self.clock()
        idle_s = None
        if trial is not None and trial.state == TrialState.RUNNING and trial.started_at:
            last, connections = self.activity.get(experiment.id)
            verdict = idle_verdict(
                Activity(trial.started_at, last or None, connections), spec.idle_timeout_s, now
            )
            idle_s = verdict.idle_s
        gpus = int((experiment.spec.get("resources") or {}).get("gpus_per_worker", 0))
        ended = trial.ended_at if trial else experiment.ended_at
        return SessionView(
            id=experiment.id,
            tenant=experiment.tenant,
            owner=experiment.owner,
            kind=spec.kind.value,
            gpus=gpus,
            state=trial.state.value if trial else experiment.state.value,
            node=attempt.placement[0] if attempt and attempt.placement else None,
            created_at=experiment.created_at,
            started_at=trial.started_at if trial else None,
            ended_at=ended if trial is None or trial.state.is_terminal else None,
            idle_s=idle_s,
            idle_timeout_s=spec.idle_timeout_s,
            url=base_url(experiment.id) + _LANDING[spec.kind],
            trial_id=trial.id if trial else None,
            message=(trial.pending_reason or trial.message) if trial else None,
        )


def _missing(session_id: int) -> NotFound:
    return NotFound(f"session {session_id} does not exist", "trainhub sessions lists them")


class SessionNotReady(TrainhubError):
    """The session exists but its server does not serve (queued, starting, ended)."""

    status_code = 503
    code = "session_not_ready"
