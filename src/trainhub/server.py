"""The control plane process: wires adapters into services, runs the API and the control loop.

This is the composition root. Settings are read once here and passed down; nothing below reads
the environment.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainhub.core import limits
from trainhub.core.isolation import DEFAULT_PIDS_PER_RANK
from trainhub.core.metric_budget import PointCaps
from trainhub.core.resources import Node
from trainhub.core.scheduling import BasePolicy
from trainhub.core.scheduling.factory import DEFAULT_POLICY, create_policy
from trainhub.core.scheduling.fair_config import FairShareConfig
from trainhub.service.admin import AdminService, IssuedToken
from trainhub.service.clock import system_clock
from trainhub.service.container import Services
from trainhub.service.control_loop import ControlLoop, LoopConfig
from trainhub.service.datasets import DatasetService
from trainhub.service.debugging import DebugService
from trainhub.service.direct_checkpoints import DirectCheckpoints
from trainhub.service.environments import EnvironmentService
from trainhub.service.experiments import ExperimentService
from trainhub.service.monitoring import MonitoringService
from trainhub.service.profiling import ProfilingService
from trainhub.service.registry import RegistryService
from trainhub.service.search import SearchService
from trainhub.service.sessions import SessionService
from trainhub.service.steering import SteeringService
from trainhub.service.tracking import TrackingService
from trainhub.service.usage import UsageService

if TYPE_CHECKING:
    from trainhub.adapters.host_files import HostFiles

_FAIR_DEFAULTS = FairShareConfig()

log = logging.getLogger("trainhub.server")


def default_home() -> Path:
    return Path(os.environ.get("TRAINHUB_HOME", Path.home() / ".trainhub"))


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=default_home)
    db_url: str | None = None  # default: SQLite in home
    storage: Path | None = None  # default: home/artifacts
    # an S3 bucket instead of a folder: s3://BUCKET/PREFIX (docs/storage.md), and its endpoint
    # (an S3-compatible server; default: AWS). Credentials: the standard AWS variables/files.
    storage_url: str | None = None
    s3_endpoint: str | None = None
    # how ranks move checkpoints with a bucket: control-plane | direct (presigned, ADR 0033)
    rank_storage: str = "control-plane"
    ray_address: str | None = None  # default: a local Ray head started (once) for this home
    # the Ray namespace of this deployment's actors and placement groups: two servers on one
    # Ray cluster (staging beside production) each need their own, or each takes the other's
    # attempts (named t1-a1, ... in both) for its own
    ray_namespace: str = "trainhub"
    host: str = "127.0.0.1"
    port: int = 8080
    advertise_url: str | None = None  # the URL trials use to reach this server
    tick_interval_s: float = 1.0
    policy: str = DEFAULT_POLICY
    # fair share: decayed-usage half-life, and how long a trial runs before it may be preempted
    # (defaults: FairShareConfig's, the one place for them)
    usage_half_life_s: float = _FAIR_DEFAULTS.half_life_s
    min_run_time_s: float = _FAIR_DEFAULTS.min_run_time_s
    preemption_cooldown_s: float = _FAIR_DEFAULTS.preemption_cooldown_s
    # reclaim patience: the share of its recent entitlement above which a tenant below its
    # guarantee waits for free GPUs instead of preempting (ADR 0022); 0 turns it off
    reclaim_patience: float = _FAIR_DEFAULTS.patience_share or 0.0
    # the share of the cluster's slots reclaims may preempt per hour (ADR 0036); 0: unbounded
    reclaim_rate: float = _FAIR_DEFAULTS.reclaim_rate_share_per_h or 0.0
    ray_num_cpus: int | None = None
    ray_num_gpus: int | None = None
    sandbox: str = "auto"  # auto | bwrap | none: how rank processes are isolated (sandbox.py)
    pids_per_rank: int = DEFAULT_PIDS_PER_RANK  # the most processes and threads of one rank
    data_dir: Path | None = None  # datasets every trial may read (TRAINHUB_DATA_DIR, read-only)
    # tenant datasets: each node's cache of them (default: its work dir) and its size cap
    dataset_cache_dir: Path | None = None
    dataset_cache_gb: float = 50.0
    monitor_interval_s: float = 5.0  # node agents sample this often; 0 turns monitoring off
    # how long a stopping trial (pruned, paused, preempted, canceled) may take to see
    # should_stop() and exit before its ranks get SIGTERM (a plain script never asks: it waits
    # all of it)
    stop_wait_s: float = LoopConfig.stop_wait_s
    # checkpoints never published (ADR 0047): how often the store is swept of them, and how
    # long after a trial's last attempt ended its unpublished bytes are kept
    leftover_sweep_interval_s: float = LoopConfig.leftover_sweep_interval_s
    leftover_grace_s: float = LoopConfig.leftover_grace_s
    # trial environments (docs/environments.md): where they are cached (default home/envs; on
    # a cluster, storage every node mounts) and the cache's size past which the least recently
    # used are removed (None: no bound)
    env_cache: Path | None = None
    env_cache_gb: float | None = None
    # who installs them: "here" (into env_cache, which nodes must mount), "nodes" (each node
    # that runs a rank, into its own cache: env_cache's path on each node, or its work dir's
    # ``envs``; ADR 0034), "auto" ("nodes" with a bucket, where no folder is shared)
    env_build: str = "auto"
    # what a trial writes (issue 24; core/limits.py has the defaults and their reasons)
    max_log_bytes_per_trial: int = limits.DEFAULT_MAX_LOG_BYTES_PER_TRIAL
    max_metric_points_per_minute: int = limits.MAX_METRIC_POINTS_PER_MINUTE
    max_metric_points_per_trial: int = limits.MAX_METRIC_POINTS_PER_TRIAL
    # warm pool (ADR 0028, 0031): idle processes with torch imported kept per node to start
    # ranks from; they hold no slot; used by sandbox-free ranks on the base environment; 0: none
    warm_pool_size: int = 2
    # CPU ranks run in one long-lived actor per node instead of an actor (a Ray worker process
    # to start) each (ADR 0031)
    hosted_ranks: bool = True
    # how the proxy reaches a session's server (ADR 0041): "auto": its socket on this host's
    # own Ray node, the relay of its rank actor on any other; "always": the relay everywhere
    session_relay: str = "auto"

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'trainhub.db'}"

    @property
    def storage_root(self) -> Path:
        return self.storage or self.home / "artifacts"

    @property
    def env_cache_root(self) -> Path:
        return self.env_cache or self.home / "envs"

    @property
    def envs_on_nodes(self) -> bool:
        if self.env_build not in ("auto", "here", "nodes"):
            raise ValueError(f"env_build must be auto, here or nodes, not {self.env_build!r}")
        return self.env_build == "nodes" or (self.env_build == "auto" and bool(self.storage_url))

    @property
    def api_url(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


def make_policy(settings: Settings) -> BasePolicy:
    """The scheduling policy the settings ask for (the core factory builds it)."""
    fair = FairShareConfig(
        half_life_s=settings.usage_half_life_s,
        min_run_time_s=settings.min_run_time_s,
        preemption_cooldown_s=settings.preemption_cooldown_s,
        patience_share=settings.reclaim_patience or None,
        reclaim_rate_share_per_h=settings.reclaim_rate or None,
    )
    return create_policy(settings.policy, fair=fair)


class LoopThread:
    """Runs control-loop ticks on one background thread; ``wake()`` runs the next one now."""

    def __init__(
        self,
        loop: ControlLoop,
        interval_s: float,
        after_tick: Callable[[], object] | None = None,
    ) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.after_tick = after_tick  # the host files' modes, checked every tick
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainhub-control-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.loop.tick()
                if self.after_tick is not None:
                    self.after_tick()
            except Exception:  # a failing tick must not end the loop; the next one retries
                log.exception("control loop tick failed")
            self._wake.wait(self.interval_s)
            self._wake.clear()


@dataclass
class ControlPlane:
    settings: Settings
    services: Services
    loop: ControlLoop
    loop_thread: LoopThread
    bootstrap_token: IssuedToken | None
    ray_address: str
    sandbox: str = "none"  # the resolved mode: bwrap | none
    warnings: tuple[str, ...] = ()  # what an admin must know (shown by `trainhub cluster`)


def make_private(settings: Settings) -> None:
    """The home, the storage root and a SQLite file: readable by the server's user only."""
    from sqlalchemy.engine import make_url

    for folder in (settings.home, settings.storage_root):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        path = Path(url.database)
        path.parent.mkdir(parents=True, exist_ok=True)
        # created now with 0600 so that SQLite's WAL and shared-memory files copy the mode
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{path}{suffix}", 0o600)


def host_files(settings: Settings) -> HostFiles:
    """What must stay private on this host: the local Ray head's folders (Ray resets them to
    0777), the SQLite databases of this control plane and its state files (issue 24)."""
    from sqlalchemy.engine import make_url

    from trainhub.adapters.host_files import HostFiles, sqlite_files
    from trainhub.adapters.optuna_search import optuna_storage_url
    from trainhub.adapters.ray_executor.local_cluster import RECORD_NAME, read_record

    files = [settings.home / "admin-token", settings.home / "ray" / RECORD_NAME]
    for url in (settings.database_url, optuna_storage_url(settings.database_url)[0]):
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, ":memory:"):
            files += sqlite_files(Path(str(parsed.database)))
    record = None if settings.ray_address else read_record(settings.home / "ray")
    return HostFiles([Path(record.temp_dir)] if record else [], files)


SHUTDOWN_GRACE_S = 10


def build_control_plane(settings: Settings) -> ControlPlane:
    from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
    from trainhub.adapters.db.dataset_store import SqlDatasetStore
    from trainhub.adapters.db.environment_store import SqlEnvironmentStore
    from trainhub.adapters.db.profile_store import SqlProfileStore
    from trainhub.adapters.db.registry_store import SqlModelStore
    from trainhub.adapters.db.sample_store import SqlSampleStore
    from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
    from trainhub.adapters.db.session_store import SqlSessionLimitStore
    from trainhub.adapters.envs.uv import UvEnvironments
    from trainhub.adapters.monitor.agent import RayNodeMonitor
    from trainhub.adapters.monitor.node_store import SqlNodeControlStore
    from trainhub.adapters.optuna_search import OptunaSearch
    from trainhub.adapters.ray_executor import RayExecutor, ensure_local_ray
    from trainhub.adapters.ray_executor.containment import resolve_isolation
    from trainhub.adapters.sample_gallery import DatasetGallery
    from trainhub.adapters.sandbox import (
        SandboxMode,
        SandboxUnavailable,
        environment_folders,
        inseparable,
        python_paths,
        resolve_mode,
        sqlite_state_files,
    )
    from trainhub.adapters.session_proxy import JupyterProbe, SessionRelay
    from trainhub.adapters.storage import open_artifact_store
    from trainhub.adapters.tensorboard_export import tensorboard_files
    from trainhub.adapters.weights_check import TorchWeightsCheck
    from trainhub.service.event_files import EventFileService

    warnings: list[str] = []
    sandbox, why_not = resolve_mode(settings.sandbox)
    if why_not:
        log.warning("%s", why_not)
        warnings.append(why_not)
    denied = [str(settings.home), str(settings.storage_root)]
    if settings.database_url.startswith("sqlite"):  # the files, not their folder (issue 31)
        denied += sqlite_state_files(settings.database_url.split("///", 1)[-1])
    if settings.storage_url:  # the bucket's credentials never reach a sandboxed rank
        denied.append(str(Path("~/.aws").expanduser()))
        if os.environ.get("AWS_SHARED_CREDENTIALS_FILE"):
            denied.append(str(Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).expanduser()))
    if sandbox == SandboxMode.BWRAP:
        clash = inseparable(denied, environment_folders())
        if clash is not None:
            raise SandboxUnavailable(
                f"the control plane's state {clash[0]} and the Python environment the trials "
                f"run with ({clash[1]}) lie one inside the other: the sandbox cannot hide one "
                "and show the other. Put the database, --home and --storage outside it "
                "(e.g. --db sqlite:///$HOME/trainhub/th.db)"
            )
    if settings.rank_storage == "direct" and not settings.storage_url:
        why = "--rank-storage direct needs --storage s3://...: ranks use the control plane"
        log.warning("%s", why)
        warnings.append(why)
    make_private(settings)
    engine = make_engine(settings.database_url)
    migrate(engine)
    uow = SqlUnitOfWork(engine)
    # a bucket is checked before anything starts: a one-line error names the endpoint
    store = open_artifact_store(
        settings.storage_url or settings.storage_root, s3_endpoint=settings.s3_endpoint
    )
    address = settings.ray_address or ensure_local_ray(
        settings.home / "ray",
        num_cpus=settings.ray_num_cpus,
        num_gpus=settings.ray_num_gpus,
    )
    isolation = None
    if sandbox == SandboxMode.BWRAP:  # cgroups, a network per trial, seccomp (ADR 0027)
        isolation, missing = resolve_isolation(settings.pids_per_rank)
        for why in missing:
            log.warning("%s", why)
        warnings += missing
    executor = RayExecutor(
        address,
        sandbox=sandbox.value,
        # with a bucket, no folder is shared: TRAINHUB_CHECKPOINT_DIR stays on the node
        checkpoint_root=None if settings.storage_url else str(settings.storage_root),
        data_dir=str(settings.data_dir) if settings.data_dir else None,
        denied=tuple(str(p) for p in denied),
        dataset_cache_dir=str(settings.dataset_cache_dir) if settings.dataset_cache_dir else None,
        dataset_cache_gb=settings.dataset_cache_gb,
        isolation=isolation,
        warm_pool_size=settings.warm_pool_size,
        hosted_ranks=settings.hosted_ranks,
        session_relay=settings.session_relay,
        env_cache=str(settings.env_cache)
        if settings.envs_on_nodes and settings.env_cache
        else None,
        namespace=settings.ray_namespace,
    )
    clock = system_clock
    config = LoopConfig(
        settings.api_url,
        usage_half_life_s=settings.usage_half_life_s,
        stop_wait_s=settings.stop_wait_s,
        leftover_sweep_interval_s=settings.leftover_sweep_interval_s,
        leftover_grace_s=settings.leftover_grace_s,
        max_log_bytes_per_trial=settings.max_log_bytes_per_trial,
    )
    search_uow = SqlSearchUnitOfWork(engine)
    backend = OptunaSearch.for_database(settings.database_url)
    search = SearchService(search_uow, backend, store, clock)
    monitoring = MonitoringService(
        RayNodeMonitor(address, executor.namespace, settings.monitor_interval_s)
        if settings.monitor_interval_s > 0
        else None,
        SqlNodeControlStore(engine),
        clock,
        lost_after_s=max(30.0, 6 * settings.monitor_interval_s),
    )

    def cluster_nodes() -> list[Node]:
        """The executor's nodes with their topology labels (agents' and stored)."""
        return monitoring.labelled(executor.cluster_nodes())

    environments = EnvironmentService(
        uow,
        SqlEnvironmentStore(engine),
        UvEnvironments(settings.env_cache_root),
        clock,
        cache_bytes=int(settings.env_cache_gb * 1024**3) if settings.env_cache_gb else None,
        nodes=executor.node_installer() if settings.envs_on_nodes else None,
    )
    loop = ControlLoop(
        uow,
        executor,
        store,
        make_policy(settings),
        config,
        clock,
        hooks=search,
        monitoring=monitoring,
        environments=environments,
        trial_files=executor,
    )
    checked_files = host_files(settings)
    sessions_box: list[SessionService] = []

    def after_tick() -> None:
        checked_files.check()
        for service in sessions_box:  # idle sessions end (docs/sessions.md)
            service.maybe_cull()

    loop_thread = LoopThread(loop, settings.tick_interval_s, after_tick)
    environments.wake = loop_thread.wake  # a build that ends starts its trials at once
    admin = AdminService(uow, clock)
    experiments = ExperimentService(
        uow, store, clock, wake_scheduler=loop_thread.wake, cluster_nodes=cluster_nodes
    )
    registry = RegistryService(
        uow, SqlModelStore(engine), store, clock, weights_check=TorchWeightsCheck()
    )
    experiments.resolve_model = registry.pin_sources
    experiments.check_environment = environments.check_request
    datasets = DatasetService(
        uow,
        SqlDatasetStore(engine),
        store,
        clock,
        # the node's Python environment and the admin's data folder keep their places
        protected_mounts=[
            *python_paths(),
            *([str(settings.data_dir)] if settings.data_dir else []),
        ],
        other_bytes=registry.models.bytes_of_tenant,
    )
    experiments.resolve_data = datasets.pin_data
    tracking = TrackingService(
        uow,
        store,
        clock,
        PointCaps(settings.max_metric_points_per_minute, settings.max_metric_points_per_trial),
    )
    tracking.observe_search = search.observe_trial  # a prune rides on the report's reply
    tracking.other_bytes = lambda tenant: (
        registry.models.bytes_of_tenant(tenant) + datasets.datasets.bytes_of_tenant(tenant)
    )
    experiments.isolation = isolation
    sessions = SessionService(
        uow,
        SqlSessionLimitStore(engine),
        experiments,
        clock,
        session_key(settings.home),
        endpoints=executor,
        probe=JupyterProbe(),
        relay=SessionRelay(),
    )
    event_files = EventFileService(uow, store, executor)
    loop.keep_trial_files = event_files.keep  # before an ended trial's folder is removed
    sessions.tensorboard_files = lambda trials: tensorboard_files(uow, trials, event_files.files)
    loop.session_env = sessions.launch_env
    sessions_box.append(sessions)
    services = Services(
        uow=uow,
        clock=clock,
        experiments=experiments,
        tracking=tracking,
        admin=admin,
        usage=UsageService(uow, clock),
        cluster_nodes=cluster_nodes,
        node_addresses=executor.node_addresses,
        sandbox=sandbox.value,
        warnings=tuple(warnings),
        steering=SteeringService(search_uow, experiments, store, backend, clock),
        monitoring=monitoring,
        models=registry,
        debugging=DebugService(
            uow, SqlSampleStore(engine), clock, DatasetGallery(settings.data_dir)
        ),
        profiling=ProfilingService(uow, SqlProfileStore(engine), store, clock),
        environments=environments,
        datasets=datasets,
        direct_checkpoints=DirectCheckpoints(tracking, store, settings.rank_storage),
        sessions=sessions,
    )
    bootstrap = admin.bootstrap()
    return ControlPlane(
        settings, services, loop, loop_thread, bootstrap, address, sandbox.value, tuple(warnings)
    )


def session_key(home: Path) -> bytes:
    """The secret every session's server secret is derived from (kept in the home, 0600)."""
    path = home / "session-key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(32))
    return path.read_bytes()


def save_admin_token(home: Path, secret: str) -> Path:
    """Keep the first admin token in a file only its user can read."""
    path = home / "admin-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    os.chmod(path, 0o600)
    return path


# a young generation of 20,000 objects instead of 700: a metrics request makes a few thousand
# objects (a batch of 1,000 points) that live until its commit, and with 20 in flight the
# default thresholds collected ~4 times a request and pushed live batches into the old
# generation, whose full collections then ran every ~30 requests
GC_THRESHOLDS = (20_000, 10, 10)


def settle_heap() -> None:
    """Keep what start-up built out of the cyclic collector's way, for the process's life.

    Modules, the app and its schemas, the ORM's mappers: ~200,000 objects that every full
    collection walked (several per 200,000 metric points ingested, and the thread that
    happened to allocate, most often the one parsing a request, paid for it: 4 ms of CPU per
    1,000-point batch parsed instead of 1). Frozen, they are never collected (they live as
    long as the process anyway); reference counting still frees what requests make. Called
    once, after the app is built and before it serves.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve(settings: Settings) -> None:
    """Run the control plane until interrupted (``trainhub server``)."""
    import uvicorn

    from trainhub.api.app import create_app

    plane = build_control_plane(settings)
    if plane.bootstrap_token is not None:
        path = save_admin_token(settings.home, plane.bootstrap_token.secret)
        print(
            "First start: created user 'admin' (tenant 'default').\n"
            f"Admin token (shown once, also saved to {path}):\n\n"
            f"    {plane.bootstrap_token.secret}\n",
            flush=True,
        )
    from sqlalchemy.engine import make_url

    database = make_url(settings.database_url).render_as_string(hide_password=True)
    print(
        f"trainhub control plane on {settings.api_url} (database {database}, "
        f"artifacts {settings.storage_url or settings.storage_root}, "
        f"Ray {plane.ray_address}, sandbox {plane.sandbox})",
        flush=True,
    )
    print(f"dashboard: {settings.api_url}/ui (log in with an API token)", flush=True)
    for warning in plane.warnings:
        print(f"WARNING: {warning}", flush=True)
    write_pid_file(settings.home)
    app = create_app(plane.services)
    settle_heap()
    plane.loop_thread.start()
    # versions registered before registration checked their weights: checked once, aside
    threading.Thread(
        target=recheck_weights, args=(plane.services,), name="trainhub-weights", daemon=True
    ).start()
    try:
        # the dashboard's live streams never end by themselves: a stop waits this long for
        # requests in flight, then closes them (browsers reconnect to the next start)
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            # the sessions' proxy takes WebSockets (kernels, terminals): the sans-I/O
            # implementation of the websockets library (its legacy one is deprecated)
            ws="websockets-sansio",
        )
    finally:
        plane.loop_thread.stop()
        with contextlib.suppress(OSError):
            if read_pid_file(settings.home) == os.getpid():
                (settings.home / PID_FILE).unlink()


def recheck_weights(services: Services) -> None:
    """Check the model versions whose weights were never checked (``RegistryService.
    recheck_weights``); a failure is logged, never fatal to the server."""
    if services.models is None:
        return
    try:
        counts = services.models.recheck_weights()
    except Exception:  # the registry keeps working; the next start tries again
        log.exception("checking registered model versions' weights failed")
        return
    if counts["misfit"]:
        log.warning(
            "%d registered model version(s) hold weights that do not load into their "
            "architecture (`trainhub models show NAME:V` says why); suggest leaves them out",
            counts["misfit"],
        )


PID_FILE = "server.pid"


def write_pid_file(home: Path) -> None:
    (home / PID_FILE).write_text(f"{os.getpid()}\n")


def read_pid_file(home: Path) -> int | None:
    try:
        return int((home / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def stop_server(home: Path, timeout_s: float = 30.0) -> list[str]:
    """End what ``trainhub server`` started for ``home``: the server, its local Ray head and
    with it the trials that still run there. Returns what was stopped, in words."""
    import psutil

    from trainhub.adapters.ray_executor import stop_local_ray
    from trainhub.adapters.ray_executor.local_cluster import read_record

    stopped = []
    pid = read_pid_file(home)
    if pid is not None and pid != os.getpid():
        try:
            proc = psutil.Process(pid)
            if "trainhub" in " ".join(proc.cmdline()) or "serve(" in " ".join(proc.cmdline()):
                proc.terminate()
                try:
                    proc.wait(timeout_s)
                except psutil.TimeoutExpired:
                    proc.kill()
                stopped.append(f"server (pid {pid})")
        except psutil.Error:
            pass
        (home / PID_FILE).unlink(missing_ok=True)
    record = read_record(home / "ray")
    if record is not None:
        stop_local_ray(home / "ray")
        stopped.append(f"local Ray head at {record.address} and its trials")
    return stopped
