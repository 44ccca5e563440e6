"""The warm pool: ranks started from a node's zygote (zygote.py) instead of a new interpreter.

The executor keeps one pool actor per node (:func:`ensure_pools`): a Ray actor that asks for no
resource at all (``num_cpus=0``, no placement group), so it never holds a slot, and runs the
node's zygote. A rank's actor (rank_worker.py) asks the zygote for a rank with :func:`spawn`
when :func:`cold_reason` finds nothing against it, and starts the rank cold otherwise:

- the trial runs in a sandbox and the node agent is not root, or the rank has GPUs: a root
  agent's zygote hands sandboxed CPU ranks out into a sandbox bwrap built around a holder
  process (warm_sandbox.py, ADR 0048);
- the trial has its own environment (a venv over the base): the zygote imported the base's
  packages, which the environment may replace;
- the entrypoint is not ``python SCRIPT.py ...`` on the node's interpreter (``torchrun``,
  ``python -m``, interpreter flags, another program).

The pool's size (``warm_pool_size``, per node) is how many forked, idle processes the zygote
keeps ready; 0 runs no zygote (and stops the pools an earlier control plane started).

A warm rank's ``/proc/PID/environ`` is the zygote's (a forked process cannot rewrite it), so
the zygote registers each rank it hands out (:func:`register_rank`: its pid, which is also its
session, with the variables node monitoring and tests look processes up by) in a folder of the
node (:func:`registry_dir`), and removes the entry when the rank ends;
:func:`warm_rank_environment` finds the entry of any process of that rank's session.

This module is imported inside Ray worker processes: standard library and ray only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SOCKET_NAME = "warm-pool.sock"
# what a warm rank's registry entry holds: what finds a trial's processes on a node
REGISTERED = ("TRAINHUB_TRIAL_ID", "RANK", "TRAINHUB_API_URL")
ACTOR_PREFIX = "warm-pool-"
_CONNECT_TIMEOUT_S = 2.0
# once the zygote read the request it may have handed the rank out: a requester that gave up
# then would start the rank cold beside a warm copy (killed only when the zygote sees the
# connection close), so the answer is awaited much longer than the connection
_REPLY_TIMEOUT_S = 60.0
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


def socket_path(attempts_root: Path) -> Path:
    """Where the zygote of a node listens: beside the attempts of its namespace."""
    return attempts_root / SOCKET_NAME


def registry_dir() -> Path:
    """Where the zygotes of this node's user register their ranks (one folder per node and
    user, whatever the control plane's work dir: the node's monitor reads it)."""
    return Path(tempfile.gettempdir()) / f"trainhub-warm-ranks-{os.getuid()}"


def register_rank(pid: int, env: Mapping[str, str]) -> None:
    """Record that the warm process ``pid`` (a session leader) is now this rank."""
    folder = registry_dir()
    folder.mkdir(mode=0o700, exist_ok=True)
    entry = {k: env[k] for k in REGISTERED if k in env}
    temporary = folder / f".{pid}.tmp"
    temporary.write_text(json.dumps(entry))
    os.replace(temporary, folder / str(pid))


def unregister_rank(pid: int) -> None:
    with contextlib.suppress(OSError):
        (registry_dir() / str(pid)).unlink()


def registered_ranks() -> dict[int, dict[str, str]]:
    """The warm ranks alive on this node: session (the rank's pid) -> its variables.

    An entry whose pid now names a process started after the entry was written (the rank
    died with its zygote, and the pid was reused) is left out."""
    import psutil

    found: dict[int, dict[str, str]] = {}
    try:
        entries = list(os.scandir(registry_dir()))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            written = entry.stat().st_mtime
            variables = json.loads(Path(entry.path).read_text())
            alive = psutil.Process(pid).create_time() <= written + 1.0
        except (OSError, ValueError, psutil.Error):
            continue
        if alive and isinstance(variables, dict):
            found[pid] = {str(k): str(v) for k, v in variables.items()}
    return found


def warm_rank_environment(
    pid: int, ranks: Mapping[int, Mapping[str, str]] | None = None
) -> Mapping[str, str] | None:
    """The registered variables of the warm rank that process ``pid`` belongs to (the rank
    itself or anything it forked: they share its session), or None."""
    ranks = registered_ranks() if ranks is None else ranks
    if not ranks:
        return None
    try:
        session = os.getsid(pid)
    except OSError:
        return None
    return ranks.get(session)


def cold_reason(
    argv: Sequence[str],
    sandbox_mode: str,
    environment_dir: str | None,
    *,
    gpus: bool = False,
    root: bool | None = None,
) -> str | None:
    """Why this rank must start cold, or None when the warm pool may start it.

    A sandboxed rank comes warm where the node agent is root and the rank has no GPU
    (warm_sandbox.py says why)."""
    if sandbox_mode != "none":
        if not (os.geteuid() == 0 if root is None else root):
            return f"the rank runs in a {sandbox_mode} sandbox of an unprivileged node agent"
        if gpus:
            return f"the rank runs on GPUs in a {sandbox_mode} sandbox"
    if environment_dir:
        return "the trial has its own environment"
    if len(argv) < 2 or os.path.basename(argv[0]) not in ("python", "python3"):
        return "the entrypoint is not `python SCRIPT.py`"
    if argv[1].startswith("-") or not argv[1].endswith(".py"):
        return "the entrypoint is not `python SCRIPT.py`"
    return None


class WarmProcess:
    """A rank forked by the zygote, as much of :class:`subprocess.Popen` as a rank actor uses:
    ``pid``, ``returncode``, ``poll()`` and ``wait()`` (the zygote reports the exit code on the
    connection; closing it kills the rank)."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        self._conn.settimeout(None)
        reply = _read_reply(self._conn)
        with contextlib.suppress(OSError):
            self._conn.close()
        if reply is None or "exit" not in reply:
            self.returncode = -signal.SIGKILL  # the zygote died, and its ranks with it
        else:
            self.returncode = int(reply["exit"])
        return self.returncode


def spawn(
    path: Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    marks_env: str,
    sandbox: Mapping[str, Any] | None = None,
) -> WarmProcess | None:
    """Ask the node's zygote for this rank; None (start it cold) when there is none or it
    refuses (it says why in the node's log). ``sandbox``: where the rank joins its sandbox
    (warm_sandbox.assignment); the pid is then its keeper's."""
    if not available(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(_CONNECT_TIMEOUT_S)
    request = {
        "argv": list(argv),
        "env": dict(env),
        "cwd": str(cwd),
        "log": str(log_path),
        "marks_env": marks_env,
    }
    if sandbox is not None:
        request["sandbox"] = dict(sandbox)
    try:
        conn.connect(str(path))
        conn.settimeout(_REPLY_TIMEOUT_S)
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = _read_reply(conn)
    except OSError as exc:
        logger.info("warm pool at %s unavailable: %s", path, exc)
        conn.close()
        return None
    if reply is None or "pid" not in reply:
        logger.info("warm pool refused a rank: %s", (reply or {}).get("error", "no answer"))
        conn.close()
        return None
    return WarmProcess(conn, int(reply["pid"]))


def available(path: Path) -> bool:
    """The node's zygote listens at ``path`` (it may still refuse a rank)."""
    return len(str(path)) <= _MAX_SOCKET_PATH and path.exists()


def _read_reply(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    parsed = json.loads(data)
    return parsed if isinstance(parsed, dict) else None


class WarmPoolActor:
    """Runs one node's zygote (as a child process that dies with the actor)."""

    def __init__(self, node_work_dir: str | None, namespace: str, size: int) -> None:
        from trainhub.adapters.ray_executor.rank_worker import node_work_root

        self._path = socket_path(node_work_root(node_work_dir) / namespace)
        path = str(self._path)
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = (self._path.parent / "warm-pool.log").open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "trainhub.adapters.ray_executor.zygote", path, str(size)],
            env=zygote_environment(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        log.close()

    def ready(self, timeout_s: float = 60.0) -> bool:
        """True once the zygote listens (it imports torch first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if self._path.exists():
                return True
            time.sleep(0.05)
        return False

    def zygote_pid(self) -> int:
        return self._proc.pid

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()


def zygote_environment(node: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: what its imports and its Python need, nothing of the node
    agent's or Ray's own. A forked rank's ``/proc/self/environ`` shows the zygote's (its
    environment block is the zygote's memory), so nothing there may be a secret."""
    from trainhub.adapters.sandbox import rank_environment

    kept = {k: node[k] for k in ("PATH", "PYTHONPATH", "TMPDIR") if k in node}
    return rank_environment(launch={}, node=node, computed=kept)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def ensure_pools(namespace: str, node_work_dir: str | None, size: int) -> list[Any]:
    """A pool actor on every alive node (created where missing); none, and the old ones
    stopped, when ``size`` is 0. Returns the actors' handles."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if size <= 0:
        stop_pools(namespace)
        return []
    remote: Any = ray.remote(WarmPoolActor)
    handles = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        handles.append(
            remote.options(
                name=f"{ACTOR_PREFIX}{node_id}",
                namespace=namespace,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_restarts=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_work_dir, namespace, size)
        )
    return handles


def stop_pools(namespace: str) -> None:
    """Stop every pool actor of the namespace (their zygotes and idle processes with them)."""
    import ray

    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != namespace or not entry["name"].startswith(ACTOR_PREFIX):
            continue
        with contextlib.suppress(Exception):
            actor = ray.get_actor(entry["name"], namespace=namespace)
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=15)
            ray.kill(actor, no_restart=True)


def interpreter_matches(argv0: str, env: Mapping[str, str]) -> bool:
    """``argv[0]`` on the rank's PATH is this interpreter (the zygote's)."""
    found = shutil.which(argv0, path=env.get("PATH", ""))
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)
