"""The warm pool of one node: a zygote process that imported torch and the trainhub runtime
once, and keeps ``size`` forked children of itself ready to become a rank (ADR 0028).

A rank's actor (rank_worker.py, through warm_pool.py) connects to the zygote's Unix socket and
sends its assignment (argv, environment, working directory, log file). The zygote hands it to
one idle child and forks a replacement. The child then becomes the rank: a new session, the
rank's environment and directory, stdout/stderr into the rank's log, and the script run as
``__main__`` as ``python script.py`` would. It serves that one rank and exits; the zygote
itself never runs user code, so no tenant's state reaches another's rank. A sandboxed rank's
child stays on the host as the rank's keeper and forks the rank into the sandbox its actor
started (warm_sandbox.py, ADR 0048).

The zygote reports each rank's pid, then its exit code, on the rank's connection; when that
connection closes first (the rank's actor died) it SIGKILLs the rank's process group, as
``PR_SET_PDEATHSIG`` does for a rank started cold. Children die with the zygote.

Run by the pool's actor: ``python -m trainhub.adapters.ray_executor.zygote SOCKET SIZE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from trainhub.adapters.ray_executor.warm_pool import register_rank, unregister_rank

_MAX_REQUEST_BYTES = 4 << 20  # argv + environment of one rank


@dataclass
class _Idle:
    pid: int
    channel: socket.socket  # the zygote's end of the child's socket pair


@dataclass
class _Zygote:
    listener: socket.socket
    size: int
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    idle: list[_Idle] = field(default_factory=list)
    ranks: dict[int, socket.socket] = field(default_factory=dict)  # pid -> requester
    wake_fds: tuple[int, ...] = ()  # the signal wake-up pipe (closed in the children)

    def fill(self) -> None:
        while len(self.idle) < self.size:
            self.idle.append(self._fork_idle())

    def _fork_idle(self) -> _Idle:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the child: wait for an assignment, then become the rank
            ours.close()
            _child(theirs, self)
        theirs.close()
        return _Idle(pid, ours)

    def assign(self, conn: socket.socket) -> None:
        request = _read_line(conn)
        if request is None:
            conn.close()
            return
        refusal = _refusal(request)
        if refusal is not None:
            _send(conn, {"error": refusal})
            conn.close()
            return
        if not self.idle:
            self.fill()
        if not self.idle:
            _send(conn, {"error": "warm pool is empty"})
            conn.close()
            return
        child = self.idle.pop(0)
        try:
            child.channel.sendall(request + b"\n")
        except OSError as exc:
            _send(conn, {"error": f"warm process gone: {exc}"})
            conn.close()
            return
        finally:
            child.channel.close()
        self.ranks[child.pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, ("rank", child.pid))
        _send(conn, {"pid": child.pid})
        self.fill()

    def requester_closed(self, pid: int) -> None:
        """The rank's actor is gone: the rank goes too (its session is its process group)."""
        conn = self.ranks.pop(pid, None)
        if conn is not None:
            self.selector.unregister(conn)
            conn.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            conn = self.ranks.pop(pid, None)
            if conn is not None:
                unregister_rank(pid)
                self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    _send(conn, {"exit": code})
                conn.close()
            else:  # an idle child died (OOM killer, a stray signal): replace it
                self.idle = [c for c in self.idle if c.pid != pid]
        self.fill()

    def close_fds_in_child(self) -> None:
        self.selector.close()
        self.listener.close()
        for conn in self.ranks.values():
            conn.close()
        for child in self.idle:
            child.channel.close()
        for fd in self.wake_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def serve(socket_path: str, size: int) -> None:
    """Import the heavy modules, fork the idle children and serve until SIGTERM."""
    _warm_imports()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)  # only the node agent's user may ask for a rank
    try:
        listener.bind(socket_path)
    finally:
        os.umask(old_umask)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    zygote = _Zygote(listener, max(1, size), wake_fds=(wake_r, wake_w))
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    zygote.fill()
    zygote.selector.register(listener, selectors.EVENT_READ, ("accept", 0))
    zygote.selector.register(wake_r, selectors.EVENT_READ, ("signal", 0))
    while not stopping:
        for key, _ in zygote.selector.select(timeout=1.0):
            what, pid = key.data
            if what == "accept":
                conn, _ = listener.accept()
                conn.settimeout(10.0)
                zygote.assign(conn)
            elif what == "signal":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                zygote.reap()
            else:  # a rank's requester said something or closed: it only ever closes
                zygote.requester_closed(pid)
        zygote.reap()
    for child in zygote.idle:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    for pid in list(zygote.ranks):
        zygote.requester_closed(pid)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)


def _refusal(request: bytes) -> str | None:
    """Why a rank cannot come from this zygote (it would run another Python than asked)."""
    from trainhub.adapters.ray_executor.warm_pool import interpreter_matches

    try:
        assignment = json.loads(request)
        argv, env = assignment["argv"], assignment["env"]
    except (ValueError, KeyError, TypeError):
        return "malformed request"
    if not interpreter_matches(argv[0], env):
        return f"{argv[0]} on the rank's PATH is not the zygote's {sys.executable}"
    if env.get("PYTHONPATH", "") != os.environ.get("PYTHONPATH", ""):
        return "the rank's PYTHONPATH differs from the zygote's"
    if assignment.get("sandbox") is not None and os.geteuid() != 0:
        return "a sandboxed rank needs a zygote that runs as root"
    return None


def _warm_imports() -> None:
    """What every rank would import first; nothing that starts a thread or touches CUDA."""
    import torch
    import torch._dynamo  # DistributedDataParallel imports it when first built
    import torch.distributed
    import torch.nn.parallel  # noqa: F401

    import trainhub.runtime.context
    import trainhub.runtime.distributed.strategies  # noqa: F401  (ctx.prepare_model's)


def _child(channel: socket.socket, zygote: _Zygote) -> None:
    """In an idle child: wait for the assignment, become the rank, never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        zygote.close_fds_in_child()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        _die_with(os.getppid())
        channel.settimeout(None)
        request = _read_line(channel)
        channel.close()
        if request is None:  # the zygote stopped
            os._exit(0)
        code = _become_rank(json.loads(request))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _become_rank(assignment: dict[str, Any]) -> int:
    argv: list[str] = assignment["argv"]
    os.setsid()  # its own process group: the actor's signals reach the whole tree
    log = os.open(assignment["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    env: dict[str, str] = assignment["env"]
    sandbox = assignment.get("sandbox")
    if sandbox is not None:  # a keeper on the host, the rank in its sandbox (warm_sandbox.py)
        from trainhub.adapters.ray_executor import warm_sandbox

        warm_sandbox.enter(sandbox, lambda pid: register_rank(pid, env), unregister_rank)
        tempfile.tempdir = None  # the zygote's answer was the host's
    else:
        register_rank(os.getpid(), env)  # node monitoring finds the rank's processes by this
    marks = _with_process_mark(env.get(assignment.get("marks_env", ""), ""))
    if marks is not None:
        env[assignment["marks_env"]] = marks
    os.chdir(assignment["cwd"])
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))  # as `python SCRIPT` sets it
    import runpy

    code = 0
    try:
        runpy.run_path(argv[1], run_name="__main__")  # sys.argv[0] stays as written
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # as the interpreter does: the script's excepthook reports
        sys.excepthook(type(exc), exc, exc.__traceback__)  # (the runtime's exits 78 on a
        code = 1  # refused spec, as it does in a rank started cold)
    return _shutdown(code)


def _shutdown(code: int) -> int:
    """What the interpreter does at exit: join threads, run atexit, flush."""
    import atexit
    import threading

    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _with_process_mark(raw: str) -> str | None:
    """The rank's startup marks with ``process_at`` = now (its process was forked earlier)."""
    try:
        marks = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return None
    if not isinstance(marks, dict):
        return None
    marks["process_at"] = time.time()
    return json.dumps(marks)


def _die_with(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(137)


def _read_line(conn: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
        if len(data) > _MAX_REQUEST_BYTES:
            return None
    return data.rstrip(b"\n")


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
