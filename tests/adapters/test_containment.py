"""A rank's containment on the real kernel: the bwrap arguments of a profile, the seccomp filter
inside a real bwrap sandbox, and the trial network with its API relay."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from trainhub.adapters import sandbox, trial_network
from trainhub.adapters.seccomp import SeccompUnavailable, filter_fd
from trainhub.core.isolation import (
    DENIED_SYSCALLS,
    GIB,
    NodeIsolation,
    TrialResources,
    isolation_profile,
)

PROFILE = isolation_profile(
    TrialResources(cpus_per_worker=1, memory_gb_per_worker=1), NodeIsolation()
)


def test_a_profile_becomes_sized_tmpfs_a_masked_sys_a_session_and_a_filter() -> None:
    plan = sandbox.SandboxPlan((), "/", profile=PROFILE, seccomp_fd=7)
    args = sandbox.bwrap_argv("bwrap", plan, ["true"])
    joined = " ".join(args)
    assert f"--size {GIB // 2} --tmpfs /tmp" in joined
    assert f"--size {GIB // 2} --tmpfs /dev/shm" in joined
    assert "--tmpfs /sys" in joined
    assert "--ro-bind-try /sys /sys" not in joined
    assert "--new-session" in args
    assert args[args.index("--seccomp") + 1] == "7"
    assert "--unshare-net" not in args  # the trial's namespace is joined before bwrap
    with pytest.raises(ValueError, match="seccomp"):
        sandbox.bwrap_argv("bwrap", sandbox.SandboxPlan((), "/", profile=PROFILE), ["true"])


def test_without_a_profile_the_sandbox_is_as_before() -> None:
    args = sandbox.bwrap_argv("bwrap", sandbox.SandboxPlan((), "/"), ["true"])
    assert "--ro-bind-try" in args
    assert "--seccomp" not in args
    assert "--size" not in args


@pytest.fixture
def bwrap() -> str:
    problem = sandbox.bwrap_problem()
    if problem is not None:
        pytest.skip(problem)
    path = sandbox.bwrap_path()
    assert path is not None
    return path


def run_sandboxed(bwrap: str, script: str) -> subprocess.CompletedProcess[str]:
    try:
        fd = filter_fd(DENIED_SYSCALLS)
    except SeccompUnavailable as exc:
        pytest.skip(str(exc))
    uid = sandbox.SANDBOX_UID_BASE if os.geteuid() == 0 else None
    plan = sandbox.SandboxPlan((), "/", uid=uid, profile=PROFILE, seccomp_fd=fd)
    try:
        return subprocess.run(
            sandbox.bwrap_argv(bwrap, plan, ["/bin/sh", "-c", script]),
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(fd)


def test_the_filter_refuses_user_namespaces_and_leaves_the_rest(bwrap: str) -> None:
    done = run_sandboxed(
        bwrap,
        "unshare -U -r true && echo USERNS; "
        "python3 -c 'import os; pid = os.fork(); os._exit(0) if pid == 0 else os.wait(); "
        'print("FORK")\'; ls /sys; df -k /dev/shm | tail -1',
    )
    assert "USERNS" not in done.stdout, done
    assert "Operation not permitted" in done.stderr
    assert "FORK" in done.stdout  # clone without CLONE_NEWUSER works (clone3 falls back)
    assert "fs" not in done.stdout.split()  # /sys shows devices only
    assert str(GIB // 2 // 1024) in done.stdout  # /dev/shm of its size


TRACE_A_CHILD = r"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_TRACEME, PTRACE_CONT, PTRACE_ATTACH, PTRACE_SEIZE = 0, 7, 16, 0x4206
child = os.fork()
if child == 0:  # a debugger's child: asks to be traced, then stops
    if libc.ptrace(PTRACE_TRACEME, 0, None, None) != 0:
        os._exit(3)
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(0)
_, status = os.waitpid(child, os.WUNTRACED)
print("CHILD_STOPPED" if os.WIFSTOPPED(status) else f"CHILD_STATUS {status}")
print("CONT", libc.ptrace(PTRACE_CONT, child, None, None))  # a tracee's request: allowed
_, status = os.waitpid(child, 0)
print("CHILD_EXIT", os.waitstatus_to_exitcode(status))
for name, request in (("ATTACH", PTRACE_ATTACH), ("SEIZE", PTRACE_SEIZE)):
    result = libc.ptrace(request, os.getppid(), None, None)  # not a child: refused
    print(name, result, ctypes.get_errno())
"""


def test_the_filter_lets_a_rank_trace_its_children_and_nothing_else(bwrap: str) -> None:
    import errno
    import shlex

    done = run_sandboxed(bwrap, f"python3 -c {shlex.quote(TRACE_A_CHILD)}")
    lines = done.stdout.splitlines()
    assert "CHILD_STOPPED" in lines, done
    assert "CONT 0" in lines, done
    assert "CHILD_EXIT 0" in lines, done
    assert f"ATTACH -1 {errno.EPERM}" in lines, done
    assert f"SEIZE -1 {errno.EPERM}" in lines, done


@pytest.fixture
def api() -> Iterator[tuple[str, int]]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello from the API")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_trial_network_reaches_the_api_and_nothing_else(api: tuple[str, int]) -> None:
    problem = trial_network.network_problem()
    if problem is not None:
        pytest.skip(problem)
    name = trial_network.namespace_name(f"test-relay-{os.getpid()}")
    network = trial_network.TrialNetwork.ensure(name, [api[0]])
    relay = trial_network.ApiRelay(network, api, api)
    try:
        other = socket.socket()  # a host service the trial must not reach
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        code = (
            "import socket, urllib.request\n"
            f"print(urllib.request.urlopen('http://{api[0]}:{api[1]}/', timeout=10).read())\n"
            "s = socket.socket(); s.settimeout(3)\n"
            f"print('REACHED' if s.connect_ex(('127.0.0.1', {port})) == 0 else 'REFUSED')\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", name, "python3", "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        other.close()
        assert "hello from the API" in done.stdout, done
        assert "REFUSED" in done.stdout, done
        # a second rank of the node finds the relay there already
        with pytest.raises(OSError, match="in use"):
            trial_network.ApiRelay(network, api, api)
    finally:
        relay.close()
        network.remove()
    assert not network.path.exists()


def test_two_attempts_with_the_same_key_never_share_a_network_or_a_cgroup() -> None:
    """Two control planes on one node both have an attempt t1-a1: Ray's ids tell them apart."""
    from trainhub.adapters.cgroups import cgroup_problem
    from trainhub.adapters.ray_executor.containment import Containment

    for problem in (trial_network.network_problem(), cgroup_problem()):
        if problem is not None:
            pytest.skip(problem)
    resources = TrialResources(cpus_per_worker=1)
    made = [
        Containment.prepare(
            f"pg{plane}-{os.getpid()}",
            f"actor{plane}-{os.getpid()}",
            0,
            resources,
            NodeIsolation(seccomp=False),
            num_nodes=1,
            env={},
        )
        for plane in (1, 2)
    ]
    try:
        first, second = made
        assert first.network is not None
        assert second.network is not None
        assert first.network.path != second.network.path
        assert first.cgroup is not None
        assert second.cgroup is not None
        assert not set(first.cgroup.folders()) & set(second.cgroup.folders())
    finally:
        for containment in made:
            containment.remove(last_on_node=True)
