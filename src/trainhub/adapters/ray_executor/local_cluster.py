"""A local Ray head in processes of its own, for the embedded (one machine) deployment.

The head runs apart from the control plane (``ray start --head`` in a new session) so that
trials, which are detached actors, outlive a control plane that stops or crashes. It is found
again through a record in the state directory, and stopped by matching its own processes only:
``ray stop`` would also stop every other Ray instance of the machine.

Token authentication stays on: a token is created in ``~/.ray/auth_token`` when none exists
(unless ``RAY_AUTH_MODE=disabled`` is set explicitly).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from trainhub.adapters.free_ports import free_port
from trainhub.core.errors import TrainhubError

RECORD_NAME = "ray_head.json"
START_LOG_NAME = "ray_start.log"
_START_TIMEOUT_S = 90.0
# a lean head, for the test suite: no autoscaler monitor (its nodes are fixed), no log monitor
# (trainhub's drivers connect with log_to_driver=False and read rank logs themselves), and no
# Python workers prestarted when the first driver connects (one per CPU, each importing Ray,
# most never used: ranks run in actors); each is a process importing Ray on every head
_LEAN_ARGS = ("--no-monitor", "--include-log-monitor=false")
_LEAN_ENV = {"RAY_prestart_worker_first_driver": "0"}
START_ATTEMPTS = 2
# what ``ray start`` prints when its node did not come up in time (a loaded machine); the last:
# a node joining a head whose GCS did not answer within its deadline
_START_TIMEOUT_SIGNS = (
    "timed out during startup",
    "The node registration",
    "Failed to get node info b'RPC error: Deadline Exceeded'",
)
_STOP_GRACE_S = 2.0  # raylet and gcs_server often ignore SIGTERM for longer


class LocalRayError(TrainhubError):
    """The local Ray head could not be started."""

    status_code = 503
    code = "local_ray_unavailable"


@dataclass(frozen=True)
class HeadRecord:
    address: str  # host:port of the GCS
    temp_dir: str  # Ray's --temp-dir: sessions, logs, sockets of this head only
    started_at: float


def ensure_local_ray(
    state_dir: Path,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    *,
    lean: bool = False,
    start_timeout_s: float = _START_TIMEOUT_S,
) -> str:
    """Return the address of the local Ray head of ``state_dir``, starting one if needed.

    A head recorded in ``state_dir`` is reused when its GCS and raylet processes still run and
    its port answers; a stale record (machine rebooted, head killed) is cleaned up and replaced.
    ``num_cpus``/``num_gpus`` apply only to a head started now (``None``: what Ray detects;
    ``num_gpus`` may advertise GPUs a machine lacks, which tests of GPU placement use).
    Ray 2.60 cannot keep a head on the loopback interface (``--node-ip-address=127.0.0.1`` is
    replaced by the machine's address and GCS/raylet listen on every interface): token
    authentication is what guards its ports (see docs/adr/0007-sandboxed-ranks.md).
    ``lean`` starts fewer of Ray's own processes (``_LEAN_ARGS``: the test suite's heads);
    ``start_timeout_s`` bounds ``ray start`` (a loaded machine needs more than the default).
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)  # the head's record and the trials' work folders
    with _locked(state_dir):
        record = read_record(state_dir)
        if record is not None:
            if head_answers(record):
                return record.address
            _kill_head_processes(record)
        record = _start_head(state_dir, num_cpus, num_gpus, lean, start_timeout_s)
        _write_record(state_dir, record)
        return record.address


def stop_local_ray(state_dir: Path) -> None:
    """Stop the head recorded in ``state_dir`` (its processes, its workers and their trials)."""
    state_dir = Path(state_dir)
    if not state_dir.exists():
        return
    with _locked(state_dir):
        record = read_record(state_dir)
        if record is None:
            return
        _kill_head_processes(record)
        shutil.rmtree(record.temp_dir, ignore_errors=True)
        (state_dir / RECORD_NAME).unlink(missing_ok=True)


def read_record(state_dir: Path) -> HeadRecord | None:
    try:
        data = json.loads((Path(state_dir) / RECORD_NAME).read_text())
        return HeadRecord(str(data["address"]), str(data["temp_dir"]), float(data["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def head_answers(record: HeadRecord) -> bool:
    """Whether the recorded head's GCS and raylet run and its GCS port accepts connections."""
    names = {p.name() for p in _head_processes(record, with_descendants=False)}
    if not {"gcs_server", "raylet"} <= names:
        return False
    host, _, port = record.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


# --- starting ---


def _start_head(
    state_dir: Path, num_cpus: int | None, num_gpus: int | None, lean: bool, timeout_s: float
) -> HeadRecord:
    """``ray start --head``, once more after a start that timed out (a raylet whose agents
    were slow to come up on a loaded machine aborts, and Ray then says "The current node timed
    out during startup": a second start, on a machine no busier, usually succeeds)."""
    for attempt in range(START_ATTEMPTS):
        try:
            return _start_head_once(state_dir, num_cpus, num_gpus, lean, timeout_s)
        except LocalRayError as exc:
            if attempt + 1 == START_ATTEMPTS or not start_timed_out(str(exc)):
                raise
    raise AssertionError("unreachable")


def start_timed_out(output: str) -> bool:
    """Whether ``ray start`` failed for want of time (another try may succeed)."""
    return any(sign in output for sign in _START_TIMEOUT_SIGNS)


@contextlib.contextmanager
def one_ray_start_at_a_time() -> Iterator[None]:
    """Held around ``ray start`` (a head or a node): one starts at a time on a machine.

    A raylet aborts when its dashboard agent (a Python process) has not opened its port about
    15 s after it started, which nodes started side by side on a small machine miss; neither
    ``RAY_raylet_start_wait_time_s`` nor ``RAY_agent_register_timeout_ms`` moves that limit
    (Ray 2.60). Each start under the lock is bounded by its own timeout."""
    # the machine's /tmp, whatever TMPDIR a caller was given (the lock is the machine's)
    folder = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    path = folder / f"trainhub-ray-start-{os.geteuid()}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start_head_once(
    state_dir: Path, num_cpus: int | None, num_gpus: int | None, lean: bool, timeout_s: float
) -> HeadRecord:
    temp_dir = _temp_dir_for(state_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    temp_dir.mkdir(parents=True, mode=0o700)
    env = dict(os.environ)
    if env.get("RAY_AUTH_MODE", "").lower() != "disabled":
        ensure_auth_token()
        env["RAY_AUTH_MODE"] = "token"
    # Ray's metrics exporter listens on every interface without authentication (a trial
    # scraped it, issue 24) and trainhub does not read it (its node agents sample psutil and
    # NVML): off, unless an admin asks for it explicitly
    env.setdefault("RAY_enable_metrics_collection", "0")
    env.setdefault("TRAINHUB_NODE_WORK_DIR", str(state_dir / "work"))
    env.pop("RAY_ADDRESS", None)
    port = free_port("")
    command = [
        *_ray_cli(),
        "start",
        "--head",
        f"--port={port}",
        f"--ray-client-server-port={free_port('')}",
        f"--dashboard-port={free_port('')}",
        "--dashboard-agent-listen-port=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if lean:
        command += _LEAN_ARGS
        env.update(_LEAN_ENV)
    # what a failed start left: the processes naming its temp dir, and Ray's client server,
    # which names only the GCS address (``--address=IP:PORT``)
    leftovers = HeadRecord(f":{port}", str(temp_dir), 0.0)
    log_path = state_dir / START_LOG_NAME
    with log_path.open("wb") as log, one_ray_start_at_a_time():
        try:
            # a new session: the head must not get the control plane's Ctrl-C or SIGHUP
            result = subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _kill_head_processes(leftovers)
            raise LocalRayError(f"`ray start --head` failed: {exc}", hint=str(log_path)) from exc
        address_file = temp_dir / "ray_current_cluster"
        if result.returncode != 0 or not address_file.exists():
            _kill_head_processes(leftovers)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise LocalRayError(
                f"`ray start --head` exited with code {result.returncode}: {tail}",
                hint=f"full output in {log_path}",
            )
    from trainhub.adapters.host_files import HostFiles

    HostFiles([temp_dir]).check()  # Ray made its folders 0777; the loop checks them again
    return HeadRecord(address_file.read_text().strip(), str(temp_dir), time.time())


def _ray_cli() -> list[str]:
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ray")
    if found:
        return [found]
    return [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]


def _temp_dir_for(state_dir: Path) -> Path:
    # short on purpose: Ray puts unix sockets under it (paths of at most 107 bytes)
    digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:10]
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 40:
        base = Path("/tmp")
    return base / f"trainhub-ray-{digest}"


def ensure_auth_token() -> None:
    """Create ~/.ray/auth_token (what `ray get-auth-token --generate` does) if no token exists.

    Call it before starting any Ray node with token authentication on a machine (or HOME) that
    never ran Ray: Ray refuses to start one without a token.
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if token_path:
        if Path(token_path).is_file():
            return
        raise LocalRayError(f"RAY_AUTH_TOKEN_PATH={token_path} does not exist")
    path = Path.home() / ".ray" / "auth_token"
    if path.is_file() and path.stat().st_size > 0:
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))


def _write_record(state_dir: Path, record: HeadRecord) -> None:
    tmp = state_dir / f".{RECORD_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(asdict(record)))
    tmp.replace(state_dir / RECORD_NAME)


# --- stopping ---


def _head_processes(record: HeadRecord, with_descendants: bool) -> list[psutil.Process]:
    """The processes of this head only: their command lines name its temp dir or address (an
    address of ``:PORT``, a head whose IP is not known yet: any IP with that GCS port)."""
    temp_dir = record.temp_dir.rstrip("/")
    exact = {f"--address={record.address}", f"--gcs-address={record.address}"}
    port_only = record.address if record.address.startswith(":") else None
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info.get("cmdline") or []
        if proc.pid in mine:
            continue
        if any(
            f"{temp_dir}/" in arg
            or arg.endswith(f"={temp_dir}")
            or arg in exact
            or (
                port_only
                and arg.startswith(("--address=", "--gcs-address="))
                and arg.endswith(port_only)
            )
            for arg in args
        ):
            found[proc.pid] = proc
    if with_descendants:
        for proc in list(found.values()):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    if child.pid not in mine:
                        found.setdefault(child.pid, child)
    return list(found.values())


def _kill_head_processes(record: HeadRecord) -> None:
    procs = _head_processes(record, with_descendants=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _running(p)]
        time.sleep(0.1)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    with (state_dir / ".ray_head.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_ensure_auth_token = ensure_auth_token  # the older private name (tests of other branches use it)
