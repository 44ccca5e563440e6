"""Warm ranks in a sandbox (ADR 0048): bwrap builds the rank's sandbox around a holder process,
and a child of the node's zygote (zygote.py) joins the holder's namespaces, drops every privilege
and becomes the rank with torch already imported.

The rank's actor starts the holder as it would start a cold sandboxed rank: the same ``bwrap``
command line (mounts, tmpfs sizes, ``/sys``, devices, namespaces, seccomp; setpriv makes the
holder uid 0 with no capability, which the rank can neither read through ``/proc`` nor
signal), entered from the same forked child (the rank's cgroup, the trial's network
namespace), with an empty environment and a shell that says ``ready`` and waits in place of
``python train.py``. Then
it hands the zygote the holder's pid with the rank's assignment. The zygote's child (the
*keeper*, which stays on the host) opens the holder's namespaces and forks the rank into its PID
namespace; the rank joins the rank's cgroup, then the holder's network, IPC, UTS, cgroup and
mount namespaces (the last changes its root to the sandbox's), and before any user code runs:
its own session, no supplementary groups, the trial's uid and gid, an empty bounding,
inheritable and ambient set and no capability, ``no_new_privs``, death with its keeper, and the
profile's seccomp program. What it sees is what bwrap built for this rank, nothing else: the
view is not built twice (``flatpak enter`` joins a running bwrap sandbox the same way).

Only a node agent that runs as root hands out sandboxed warm ranks (an unprivileged agent's
sandbox has a user namespace the zygote's child could join but not leave its own uid in), and
only CPU ranks (a GPU rank's device view has not been tried on a GPU yet): the others start
cold, as before. The keeper reports the rank's exit as its own (dying of the rank's signal
where a signal ended it); when the rank ends the actor closes the holder, whose sandbox ends
with it.

This module is imported inside Ray worker processes and by the zygote: standard library only
(psutil on the actor's side).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import resource
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainhub.adapters.sandbox import SandboxPlan

# what the holder runs in the rank's place: it says it is inside, then waits for its stdin to
# close (the actor closes it when the rank ended; the actor's death closes it too)
HOLDER_ARGV = ("/bin/sh", "-c", "echo ready; read line")
_READY_TIMEOUT_S = 10.0
# the holder's namespaces a rank joins, in this order: the cgroup namespace after the rank
# joined its cgroup, the mount namespace last (it moves the root to the sandbox's)
JOINED = ("net", "ipc", "uts", "cgroup", "mnt")
# bwrap makes these for every rank: a holder in the host's would leave the rank unsandboxed
MUST_DIFFER = ("mnt", "pid", "ipc", "uts")

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_CAP_LAST_POSSIBLE = 63


class SandboxJoinError(RuntimeError):
    """The rank could not join its sandbox (it never runs then)."""


@dataclass
class Holder:
    """A rank's sandbox with a shell holding it open (the actor's side)."""

    proc: subprocess.Popen[bytes]
    pid: int  # the shell inside: the process whose namespaces the rank joins

    def close(self) -> None:
        """End the sandbox: the shell reads the end of its input and exits, and bwrap's init
        with it (its PID namespace, and whatever of the rank was left in it, goes too)."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with contextlib.suppress(OSError):
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_holder(
    bwrap_command: Sequence[str],
    preexec: Callable[[], None],
    pass_fds: Sequence[int],
    log_fd: int,
) -> Holder:
    """Start the sandbox of one rank with the holder inside and wait until it is in place.

    ``bwrap_command`` is :func:`trainhub.adapters.sandbox.bwrap_argv` of :func:`holder_plan`
    with :data:`HOLDER_ARGV`; ``preexec`` what the cold rank's forked child runs (its cgroup, the
    trial's network). bwrap's own complaints go to the rank's log (``log_fd``).
    """
    import psutil

    proc = subprocess.Popen(
        list(bwrap_command),
        env={},  # nothing of the actor's environment enters the sandbox
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log_fd,
        start_new_session=True,
        preexec_fn=preexec,  # noqa: PLW1509
        pass_fds=tuple(pass_fds),
    )
    holder = Holder(proc, 0)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], _READY_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        holder.close()
        raise SandboxJoinError(f"the rank's sandbox did not start (bwrap exit {proc.poll()})")
    try:
        inside = [p for p in psutil.Process(proc.pid).children(recursive=True) if not p.children()]
    except psutil.Error as exc:
        holder.close()
        raise SandboxJoinError(f"the rank's sandbox ended at once: {exc}") from exc
    if len(inside) != 1:
        holder.close()
        raise SandboxJoinError(f"the rank's sandbox holds {len(inside)} processes, not 1")
    holder.pid = inside[0].pid
    return holder


def holder_plan(plan: SandboxPlan) -> SandboxPlan:
    """The rank's plan for its holder: the same sandbox, the holder as uid 0 with no
    capability (setpriv empties its bounding set). The rank, under the trial's uid, can then
    neither read the holder's ``/proc`` files nor signal it, as with bwrap's own init."""
    return dataclasses.replace(plan, uid=0)


def assignment(
    holder: Holder,
    uid: int,
    cwd: str,
    cgroup_procs: Sequence[str],
    seccomp_program: bytes | None,
) -> dict[str, Any]:
    """What the zygote's child needs to join ``holder``'s sandbox (sent with the rank's
    assignment, over the zygote's socket, which only the node agent's user can open)."""
    return {
        "holder": holder.pid,
        "uid": uid,
        "cwd": cwd,
        "cgroup_procs": list(cgroup_procs),
        "seccomp": seccomp_program.hex() if seccomp_program else "",
    }


class SandboxedRank:
    """A warm rank in its sandbox, as much of :class:`subprocess.Popen` as a rank actor uses;
    the sandbox is closed once the rank has ended."""

    def __init__(self, rank: Any, holder: Holder) -> None:
        self._rank = rank  # warm_pool.WarmProcess: pid is the keeper's, the rank its child
        self._holder = holder
        self.pid: int = rank.pid

    @property
    def returncode(self) -> int | None:
        return self._rank.returncode  # type: ignore[no-any-return]

    def poll(self) -> int | None:
        return self._rank.poll()  # type: ignore[no-any-return]

    def wait(self) -> int:
        try:
            return self._rank.wait()  # type: ignore[no-any-return]
        finally:  # the exit is reported at once; the sandbox ends beside it
            threading.Thread(target=self._holder.close, name="close-sandbox", daemon=True).start()


# --- in the zygote's child ---


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]  # prctl is variadic: c_ulong args
    return libc


def enter(
    request: Mapping[str, Any],
    on_started: Callable[[int], None],
    on_ended: Callable[[int], None],
) -> None:
    """Become the rank inside the holder's sandbox; returns in the rank only.

    Called in the zygote's child (the keeper) after it took the rank's log as its output. The
    keeper forks the rank into the holder's PID namespace, reports its host pid
    (``on_started``), waits for it and exits with its code; the rank returns from here with
    nothing of the host left to it but its log and the modules the zygote imported.
    """
    holder = int(request["holder"])
    fds = _open_namespaces(holder)
    try:
        if _libc().setns(fds["pid"], 0) != 0:  # the children of the keeper only
            raise SandboxJoinError(_errno_text("join the sandbox's PID namespace"))
    except BaseException:
        _close(fds)
        raise
    rank = os.fork()
    if rank:
        _close(fds)
        _keep(rank, on_started, on_ended)
    try:
        _join(fds, request["cgroup_procs"])
        os.setsid()  # the rank's own session: its actor signals the whole tree
        os.chdir(request["cwd"])
        _drop_privileges(int(request["uid"]))
        _die_with_keeper()
        program = bytes.fromhex(request["seccomp"])
        if program:
            _load_seccomp(program)
    except BaseException as exc:
        print(f"trainhub: the warm rank could not enter its sandbox: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(126)


def _open_namespaces(holder: int) -> dict[str, int]:
    fds: dict[str, int] = {}
    try:
        for ns in (*JOINED, "pid", "user"):
            path = f"/proc/{holder}/ns/{ns}"
            if ns == "cgroup" and not os.path.exists(path):
                continue  # a kernel without cgroup namespaces: bwrap made none either
            fds[ns] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        for ns in MUST_DIFFER:
            if os.fstat(fds[ns]).st_ino == os.stat(f"/proc/self/ns/{ns}").st_ino:
                raise SandboxJoinError(f"the holder {holder} is in the host's {ns} namespace")
        if os.fstat(fds["user"]).st_ino != os.stat("/proc/self/ns/user").st_ino:
            raise SandboxJoinError(f"the holder {holder} is in a user namespace of its own")
    except BaseException:
        _close(fds)
        raise
    return fds


def _keep(rank: int, on_started: Callable[[int], None], on_ended: Callable[[int], None]) -> None:
    """The keeper: on the host, waits for the rank and exits with its code (never returns)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the actor's SIGTERM is for the rank's tree
    code = 1
    try:
        on_started(rank)
        _, status = os.waitpid(rank, 0)
        code = os.waitstatus_to_exitcode(status)
        on_ended(rank)
        if code < 0:  # the rank died of a signal: so does its keeper, for the zygote to say so
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have none
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code if code >= 0 else 128 - code)


def _join(fds: dict[str, int], cgroup_procs: Sequence[str]) -> None:
    for path in cgroup_procs:  # on the host's cgroup file system: before the mount namespace
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # 0: the writer (the rank's pid differs in its namespace)
        finally:
            os.close(fd)
    try:
        for ns in JOINED:
            if ns in fds and _libc().setns(fds[ns], 0) != 0:
                raise SandboxJoinError(_errno_text(f"join the sandbox's {ns} namespace"))
    finally:
        _close(fds)


def _drop_privileges(uid: int) -> None:
    libc = _libc()
    for cap in range(_CAP_LAST_POSSIBLE + 1):  # EINVAL past the kernel's last capability
        _prctl(_PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to a uid: permitted and effective sets emptied
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # and the inheritable set too
    if libc.capset(header, data) != 0:
        raise SandboxJoinError(_errno_text("drop the capabilities"))
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise SandboxJoinError(_errno_text("set no_new_privs"))
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise SandboxJoinError(f"still uid {os.getuid()}, not {uid}")
    # the uid change made the process undumpable (its /proc files root's, as after a setuid
    # program); a cold rank's exec made it dumpable again, as its own uid: so does this
    _prctl(_PR_SET_DUMPABLE, 1)


def _die_with_keeper() -> None:
    """SIGKILL the rank when its keeper dies (set after the uid change, which clears it)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != 0:  # the keeper is outside the namespace: 0 while it lives
        os._exit(137)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _load_seccomp(program: bytes) -> None:
    """Install the profile's filter (the raw ``sock_filter`` array bwrap reads, 8 bytes each)."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog)) != 0:
        raise SandboxJoinError(_errno_text("load the seccomp filter"))


def _prctl(option: int, arg2: int, arg3: int = 0) -> int:
    """prctl with its unused arguments 0 (some options refuse anything else)."""
    zero = ctypes.c_ulong(0)
    args = (ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), zero, zero)
    return int(_libc().prctl(ctypes.c_int(option), *args))


def _close(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _errno_text(what: str) -> str:
    number = ctypes.get_errno()
    return f"cannot {what}: {os.strerror(number)}"
