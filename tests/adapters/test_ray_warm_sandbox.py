"""Warm ranks in a sandbox (ADR 0048) against a real local Ray head, bwrap, cgroups, a trial
network and seccomp: a rank forked from the zygote into the sandbox bwrap built for it sees and
may do exactly what the same rank started cold sees and may do, and it came with torch
imported."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor, warm_pool
from trainhub.adapters.sandbox import bwrap_problem
from trainhub.core.isolation import NodeIsolation
from trainhub.service.ports import AttemptLaunch, AttemptPhase

pytestmark = pytest.mark.ray

# what a rank sees and may do, printed at its first line
PROBE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    preloaded = "torch" in sys.modules
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    environ = open("/proc/self/environ", "rb").read().split(b"\\0")
    libc = ctypes.CDLL(None, use_errno=True)
    refused = libc.unshare(0x10000000) != 0 and ctypes.get_errno()  # CLONE_NEWUSER
    marks = json.loads(os.environ.get("TRAINHUB_STARTUP_MARKS", "{}"))
    print("PROBE " + json.dumps({
        "preloaded": preloaded, "warm": marks.get("warm", False),
        "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "caps": {k: status[k].strip() for k in status if k.startswith("Cap")},
        "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
        "user_namespace_refused": refused,
        "root": sorted(os.listdir("/")), "code": sorted(os.listdir(".")), "cwd": os.getcwd(),
        "tmp_writable": os.access("/tmp", os.W_OK), "sys": sorted(os.listdir("/sys")),
        "net": os.stat("/proc/self/ns/net").st_ino,
        "environ_keys": sorted({e.split(b"=", 1)[0].decode() for e in environ if e}),
        "fds": sorted(os.listdir("/proc/self/fd")), "session": os.getsid(0) == os.getpid(),
        "pid": os.getpid(), "others": [p for p in os.listdir("/proc") if p.isdigit()],
    }), flush=True)
    """
)


@pytest.fixture(scope="module")
def sandboxed(ray_address: str):
    if os.geteuid() != 0:
        pytest.skip("sandboxed warm ranks need a node agent that runs as root")
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    executor = RayExecutor(
        ray_address,
        namespace=TEST_NAMESPACE,
        sandbox="bwrap",
        isolation=NodeIsolation(),
        warm_pool_size=2,
        fail_fast_grace_s=5.0,
    )
    import ray

    handles = warm_pool.ensure_pools(TEST_NAMESPACE, None, 2)
    assert all(ray.get([h.ready.remote() for h in handles], timeout=180))
    yield executor
    warm_pool.stop_pools(TEST_NAMESPACE)


def _launch(executor: RayExecutor, trial_id: int, argv: tuple[str, ...], script: str):
    node = executor.cluster_nodes()[0].node_id
    return AttemptLaunch(
        attempt_key=new_attempt_key("warmbox"),
        trial_id=trial_id,
        attempt=1,
        argv=argv,
        context_archive=make_context({"probe.py": script}),
        env={"TRAINHUB_TRIAL_ID": str(trial_id)},
        placement=(node,),
        cpus_per_worker=0.5,
        memory_gb_per_worker=1.0,
    )


def _probe(executor: RayExecutor, attempt: AttemptLaunch) -> dict:
    executor.launch(attempt)
    try:
        watch = Watch(executor, attempt.attempt_key)
        status = watch.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=180)
        text = watch.text(0)
        assert status.phase == AttemptPhase.EXITED, text
        assert status.ranks[0].exit_code == 0, text
        lines = [ln for ln in text.splitlines() if ln.startswith("PROBE ")]
        assert lines, text
        return json.loads(lines[0][6:])
    finally:
        executor.release(attempt.attempt_key)


def test_a_warm_sandboxed_rank_sees_and_may_do_what_a_cold_one_does(
    sandboxed: RayExecutor,
) -> None:
    warm = _probe(sandboxed, _launch(sandboxed, 301, ("python", "probe.py"), PROBE))
    # `python -u` is not `python SCRIPT.py`: the same rank, started cold by bwrap itself
    cold = _probe(sandboxed, _launch(sandboxed, 301, ("python", "-u", "probe.py"), PROBE))
    assert warm["preloaded"], warm
    assert warm["warm"], warm
    assert not cold["preloaded"], cold
    assert not cold["warm"], cold
    for key in ("uid", "gid", "groups", "caps", "no_new_privs", "seccomp", "root", "code"):
        assert warm[key] == cold[key], (key, warm[key], cold[key])
    for key in ("cwd", "tmp_writable", "sys", "user_namespace_refused"):
        assert warm[key] == cold[key], (key, warm[key], cold[key])
    assert warm["uid"] >= 200_000
    assert warm["groups"] == []
    assert set(warm["caps"].values()) == {"0000000000000000"}
    assert warm["no_new_privs"] == "1"
    assert warm["seccomp"] == "2"
    assert warm["user_namespace_refused"] == 1  # EPERM, from the profile's filter
    assert warm["session"]  # its own session: the actor signals its whole tree
    # its own PID namespace: bwrap's init, the holder and itself, nothing of the host's
    assert len(warm["others"]) <= 3, warm["others"]
    assert warm["pid"] <= 3, warm["pid"]
    host_net = os.stat("/proc/self/ns/net").st_ino
    assert warm["net"] != host_net  # the trial's network
    assert cold["net"] != host_net
    # nothing of the zygote's descriptors, nor of the node agent's or Ray's environment
    assert set(warm["fds"]) <= {"0", "1", "2", "3"}, warm["fds"]
    assert not [k for k in warm["environ_keys"] if k.startswith(("RAY", "TRAINHUB"))], warm


def test_a_warm_sandboxed_rank_is_terminated_and_its_sandbox_goes(
    sandboxed: RayExecutor,
) -> None:
    sleeper = textwrap.dedent(
        """
        import signal, sys, time
        def stop(*_):
            print("got SIGTERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("UP", flush=True)
        time.sleep(300)
        """
    )
    attempt = _launch(sandboxed, 302, ("python", "probe.py"), sleeper)
    sandboxed.launch(attempt)
    try:
        watch = Watch(sandboxed, attempt.attempt_key)
        watch.until(lambda s: "UP" in watch.text(0), timeout_s=180)
        (rank,) = [  # the zygote registers the rank's host pid for node monitoring
            pid
            for pid, variables in warm_pool.registered_ranks().items()
            if variables.get("TRAINHUB_TRIAL_ID") == "302"
        ]
        keeper = psutil.Process(rank).parent()  # the keeper stays on the host
        assert keeper is not None
        assert os.stat(f"/proc/{keeper.pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino
        sandbox = os.stat(f"/proc/{rank}/ns/mnt").st_ino
        cgroups = Path(f"/proc/{rank}/cgroup").read_text()
        assert "/rank0-" in cgroups, cgroups  # the rank's own cgroup (containment.py names it)
        assert sandbox != os.stat("/proc/self/ns/mnt").st_ino
        assert len(_inside(sandbox)) == 3  # bwrap's init, the holder's shell, the rank
        sandboxed.terminate(attempt.attempt_key, grace_s=5.0)
        status = watch.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=60)
        assert "got SIGTERM" in watch.text(0)  # the grace period reached the script
        assert status.ranks[0].exit_code == 0, watch.text(0)
        deadline = time.monotonic() + 30
        while _inside(sandbox) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _inside(sandbox)  # the sandbox bwrap built for the rank ended with it
    finally:
        sandboxed.release(attempt.attempt_key)


def _inside(mount_namespace: int) -> list[int]:
    """The host's pids of the processes in that mount namespace."""
    found = []
    for pid in psutil.pids():
        try:
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino == mount_namespace:
                found.append(pid)
        except OSError:
            continue
    return found


def test_an_uncaught_exception_reaches_the_script_s_excepthook(sandboxed: RayExecutor) -> None:
    """As in an interpreter: the runtime's hook exits 78 on a refused spec (a rank started
    warm exited 1 there, so a refused pipeline trial was restarted)."""
    script = textwrap.dedent(
        """
        import os, sys
        def hook(kind, value, tb):
            print("HOOK", kind.__name__, value, flush=True)
            os._exit(42)
        sys.excepthook = hook
        raise ValueError("refused")
        """
    )
    attempt = _launch(sandboxed, 303, ("python", "probe.py"), script)
    sandboxed.launch(attempt)
    try:
        watch = Watch(sandboxed, attempt.attempt_key)
        status = watch.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=180)
        assert "HOOK ValueError refused" in watch.text(0), watch.text(0)
        assert status.ranks[0].exit_code == 42
    finally:
        sandboxed.release(attempt.attempt_key)
