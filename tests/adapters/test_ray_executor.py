"""RayExecutor against a real local Ray head (no mocks): launch, poll, logs, failures, signals,
release, and a control plane that restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.core.errors import Conflict
from trainhub.service.ports import AttemptLaunch, AttemptPhase, RankPhase

pytestmark = pytest.mark.ray

ENV_REPORT = textwrap.dedent(
    """
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TRAINHUB_SPOOL_DIR", "PYTHONUNBUFFERED", "USER_VAR"]
    report = {k: os.environ.get(k) for k in keys}
    report["executable"] = sys.executable
    report["cwd"] = os.getcwd()
    report["helper"] = open("data/helper.txt").read()
    print(json.dumps(report))
    print("to stderr", file=sys.stderr)
    """
)

SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    print("pid", os.getpid(), flush=True)
    print("cwd", os.getcwd(), flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 300)
    """
)


def make_launch(
    executor: RayExecutor,
    files: dict[str, str],
    argv: tuple[str, ...],
    workers: int = 2,
    key: str | None = None,
    **kwargs: object,
) -> AttemptLaunch:
    node = executor.cluster_nodes()[0].node_id
    return AttemptLaunch(
        attempt_key=key or new_attempt_key(),
        trial_id=1,
        attempt=1,
        argv=argv,
        context_archive=make_context(files),
        env={"USER_VAR": "hello"},
        placement=(node,) * workers,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def run(ray_executor: RayExecutor):
    """Launch attempts and always release them, even when the test fails."""
    launched: list[str] = []

    def start(launch: AttemptLaunch) -> Watch:
        ray_executor.launch(launch)
        launched.append(launch.attempt_key)
        return Watch(ray_executor, launch.attempt_key)

    yield start
    for key in launched:
        ray_executor.release(key)


def pids_in(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("pid ")]


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_two_ranks_exit_zero_with_torchrun_env_and_logs(ray_executor: RayExecutor, run) -> None:
    files = {"main.py": ENV_REPORT, "data/helper.txt": "unpacked"}
    watch = run(make_launch(ray_executor, files, ("python", "main.py")))

    status = watch.until_phase(AttemptPhase.EXITED)

    assert [(r.phase, r.exit_code) for r in status.ranks] == [(RankPhase.EXITED, 0)] * 2
    reports = [json.loads(watch.text(r).splitlines()[0]) for r in (0, 1)]
    for rank, report in enumerate(reports):
        assert report["RANK"] == str(rank)
        assert report["LOCAL_RANK"] == str(rank)  # both ranks share the only node
        assert report["WORLD_SIZE"] == report["LOCAL_WORLD_SIZE"] == "2"
        assert report["GROUP_RANK"] == report["NODE_RANK"] == "0"
        assert report["USER_VAR"] == "hello"
        assert report["PYTHONUNBUFFERED"] == "1"
        assert report["helper"] == "unpacked"
        # the interpreter of the node (a worktree's .venv may be a link to it)
        assert Path(report["executable"]).parent.resolve() == Path(sys.executable).parent.resolve()
        assert Path(report["TRAINHUB_SPOOL_DIR"]).is_dir()
        assert "to stderr" in watch.text(rank)
    assert reports[0]["MASTER_ADDR"] == reports[1]["MASTER_ADDR"]
    assert reports[0]["MASTER_PORT"] == reports[1]["MASTER_PORT"] != "0"
    assert reports[0]["cwd"] != reports[1]["cwd"]  # every rank unpacks its own copy
    assert {r.node_id for r in status.ranks} == {ray_executor.cluster_nodes()[0].node_id}


def test_gloo_all_reduce_across_two_ranks(ray_executor: RayExecutor, run) -> None:
    script = textwrap.dedent(
        """
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR/PORT
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print("sum", t.item())
        dist.destroy_process_group()
        """
    )
    watch = run(make_launch(ray_executor, {"ddp.py": script}, ("python", "ddp.py")))

    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=120)

    assert [r.exit_code for r in status.ranks] == [0, 0], watch.logs
    assert "sum 3.0" in watch.text(0)
    assert "sum 3.0" in watch.text(1)


def test_failing_rank_is_reported_and_stops_the_gang(ray_executor: RayExecutor, run) -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("rank 1 fails")
            sys.exit(3)
        time.sleep(300)  # like a rank blocked in a collective with the dead one
        """
    )
    watch = run(make_launch(ray_executor, {"main.py": script}, ("python", "main.py")))

    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=60)

    assert status.ranks[1].exit_code == 3
    assert status.ranks[0].exit_code == -signal.SIGTERM  # stopped by the fail-fast rule
    assert "rank 1 exited with code 3" in status.detail
    assert "rank 1 fails" in watch.text(1)


def test_missing_command_exits_127_with_a_message(ray_executor: RayExecutor, run) -> None:
    watch = run(make_launch(ray_executor, {}, ("no-such-command-xyz",), workers=1))

    status = watch.until_phase(AttemptPhase.EXITED)

    assert status.ranks[0].exit_code == 127
    assert "no-such-command-xyz" in watch.text(0)


def test_terminate_kills_the_whole_process_tree(ray_executor: RayExecutor, run) -> None:
    # the rank ignores SIGTERM and has a child that ignores it too, with a grandchild
    script = textwrap.dedent(
        """
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import os, signal, subprocess, time;"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "g = subprocess.Popen(['sleep', '300']);"
            "print('pid', os.getpid(), flush=True); print('pid', g.pid, flush=True);"
            "time.sleep(300)"])
        print("pid", os.getpid(), flush=True)
        time.sleep(300)
        """
    )
    watch = run(make_launch(ray_executor, {"main.py": script}, ("python", "main.py"), workers=1))
    watch.until(lambda s: len(pids_in(watch.text(0))) == 3, timeout_s=60)
    pids = pids_in(watch.text(0))

    started = time.monotonic()
    ray_executor.terminate(watch.attempt_key, grace_s=1.0)
    assert time.monotonic() - started < 1.0  # the SIGKILL escalation happens on the node
    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=30)

    assert status.ranks[0].exit_code == -signal.SIGKILL  # it ignored SIGTERM
    assert wait_gone(pids) == []


def test_terminate_with_sigterm_ends_a_cooperative_rank(ray_executor: RayExecutor, run) -> None:
    watch = run(make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py")))
    watch.until(lambda s: all(pids_in(watch.text(r)) for r in (0, 1)))
    pids = [pids_in(watch.text(r))[0] for r in (0, 1)]

    ray_executor.terminate(watch.attempt_key, grace_s=30.0)
    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=20)

    assert [r.exit_code for r in status.ranks] == [-signal.SIGTERM] * 2
    assert wait_gone(pids) == []


def test_rank_killed_with_sigkill_shows_minus_9(ray_executor: RayExecutor, run) -> None:
    watch = run(make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py")))
    watch.until(lambda s: bool(pids_in(watch.text(1))))

    os.kill(pids_in(watch.text(1))[0], signal.SIGKILL)
    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=30)

    assert status.ranks[1].exit_code == -signal.SIGKILL
    assert status.ranks[0].exit_code == -signal.SIGTERM  # fail fast


def test_release_frees_resources_and_files(ray_executor: RayExecutor, run) -> None:
    node = ray_executor.cluster_nodes()[0]
    assert node.hostname == socket.gethostname()  # what the pages show for its id
    _wait_free_cpus(ray_executor, node.total_cpus)
    launch = make_launch(
        ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py"), cpus_per_worker=2.0
    )
    watch = run(launch)
    watch.until_phase(AttemptPhase.RUNNING)
    assert _wait_free_cpus(ray_executor, node.total_cpus - 4)
    watch.until(lambda s: all("cwd" in watch.text(r) for r in (0, 1)))
    pids = [pids_in(watch.text(r))[0] for r in (0, 1)]
    rank_dirs = [Path(watch.text(r).split("cwd ")[1].split()[0]).parent for r in (0, 1)]
    assert all(d.is_dir() for d in rank_dirs)

    ray_executor.release(launch.attempt_key)
    ray_executor.release(launch.attempt_key)  # idempotent

    assert _wait_free_cpus(ray_executor, node.total_cpus)
    assert ray_executor.poll(launch.attempt_key, {}).phase == AttemptPhase.UNKNOWN
    assert launch.attempt_key not in ray_executor.live_attempts()
    assert wait_gone(pids) == []
    assert not any(d.exists() for d in rank_dirs)


def _wait_free_cpus(executor: RayExecutor, cpus: float, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if executor.cluster_nodes()[0].free_cpus == cpus:
            return True
        time.sleep(0.1)
    raise AssertionError(f"free CPUs {executor.cluster_nodes()[0].free_cpus}, expected {cpus}")


def test_ray_kill_of_a_rank_actor_is_lost(ray_executor: RayExecutor, run) -> None:
    import ray

    watch = run(make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py")))
    watch.until(lambda s: bool(pids_in(watch.text(1))))
    pid = pids_in(watch.text(1))[0]

    ray.kill(ray.get_actor(f"{watch.attempt_key}-rank1", namespace=TEST_NAMESPACE))
    status = watch.until_phase(AttemptPhase.LOST, timeout_s=30)

    assert status.ranks[1].phase == RankPhase.LOST
    assert status.ranks[0].phase == RankPhase.RUNNING
    assert "rank 1 lost:" in status.detail
    assert "rank 0" not in status.detail
    assert wait_gone([pid]) == []  # the rank's process dies with its actor


def test_log_offsets_resume_without_gaps_or_repeats(ray_executor: RayExecutor, run) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        for i in range(40):
            print(f"line {i}", flush=True)
            time.sleep(0.01)
        sys.stdout.write("x" * (2_500_000) + "\\n")
        print("end")
        """
    )
    watch = run(make_launch(ray_executor, {"main.py": script}, ("python", "main.py"), workers=1))
    watch.until_phase(AttemptPhase.EXITED)
    watch.until(lambda s: watch.text(0).endswith("end\n"))  # the rest, at most 1 MiB per poll

    expected = "".join(f"line {i}\n" for i in range(40)) + "x" * 2_500_000 + "\nend\n"
    assert watch.text(0) == expected
    assert watch.polls >= 3
    tail = ray_executor.poll(watch.attempt_key, {0: len(expected) - 4}).ranks[0].log_chunk
    assert tail == b"end\n"
    assert len(ray_executor.poll(watch.attempt_key, {0: 0}).ranks[0].log_chunk) == 1 << 20


def test_new_executor_takes_over_attempts_of_a_dead_control_plane(
    ray_address: str, ray_executor: RayExecutor
) -> None:
    key = new_attempt_key("restart")
    # a control plane that launches and dies at once, before any rank has even started
    launcher = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path.cwd())!r})
        from tests.fixtures.ray_cluster import make_context
        from trainhub.adapters.ray_executor import RayExecutor
        from trainhub.service.ports import AttemptLaunch
        ex = RayExecutor({ray_address!r}, namespace={TEST_NAMESPACE!r})
        node = ex.cluster_nodes()[0].node_id
        ex.launch(AttemptLaunch(attempt_key={key!r}, trial_id=7, attempt=1,
            argv=("python", "sleep.py"), context_archive=make_context({{"sleep.py": {SLEEPER!r}}}),
            env={{}}, placement=(node, node)))
        """
    )
    subprocess.run([sys.executable, "-c", launcher], check=True, timeout=120)
    try:
        fresh = RayExecutor(ray_address, namespace=TEST_NAMESPACE)  # after the restart

        assert key in fresh.live_attempts()
        watch = Watch(fresh, key)
        status = watch.until(lambda s: all(pids_in(watch.text(r)) for r in (0, 1)))
        assert status.phase == AttemptPhase.RUNNING
        fresh.terminate(key, grace_s=5.0)
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=20)
        assert [r.exit_code for r in status.ranks] == [-signal.SIGTERM] * 2
    finally:
        RayExecutor(ray_address, namespace=TEST_NAMESPACE).release(key)
    assert key not in ray_executor.live_attempts()


def test_unknown_and_placing_attempts(ray_executor: RayExecutor, run) -> None:
    assert ray_executor.poll("no-such-attempt", {}).phase == AttemptPhase.UNKNOWN
    ray_executor.terminate("no-such-attempt")
    ray_executor.release("no-such-attempt")

    too_big = make_launch(
        ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py"), cpus_per_worker=64.0
    )
    watch = run(too_big)
    status = watch.poll()
    assert status.phase == AttemptPhase.PLACING
    assert [r.phase for r in status.ranks] == [RankPhase.STARTING] * 2
    assert too_big.attempt_key in ray_executor.live_attempts()
    with pytest.raises(Conflict):
        ray_executor.launch(too_big)

    started = time.monotonic()
    ray_executor.terminate(too_big.attempt_key)  # nothing runs yet: nothing to wait for
    ray_executor.release(too_big.attempt_key)
    assert time.monotonic() - started < 2.0
    assert ray_executor.poll(too_big.attempt_key, {}).phase == AttemptPhase.UNKNOWN


def test_cluster_nodes_reports_capacity(ray_executor: RayExecutor) -> None:
    import ray

    nodes = ray_executor.cluster_nodes()

    assert [n.node_id for n in nodes] == [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert nodes[0].total_cpus == 8.0
    assert nodes[0].total_gpus == 0
    assert nodes[0].alive
    # host memory as Ray schedules it (its "memory" resource), which the bundles reserve
    memory = next(n["Resources"]["memory"] for n in ray.nodes() if n["Alive"]) / 1024**3
    assert nodes[0].total_memory_gb == pytest.approx(memory)
    assert 0 < nodes[0].free_memory_gb <= nodes[0].total_memory_gb


def test_launch_to_process_start_latency(ray_executor: RayExecutor, run) -> None:
    script = "import time; print('started', time.time(), flush=True)\n"
    samples = []
    for _ in range(3):
        launch = make_launch(ray_executor, {"main.py": script}, ("python", "main.py"))
        before = time.time()
        watch = run(launch)
        returned = time.time()
        watch.until(lambda s, w=watch: all("started" in w.text(r) for r in (0, 1)))
        seen = time.time()
        started = max(float(watch.text(r).split()[1]) for r in (0, 1))
        samples.append((returned - before, started - before, seen - before))
        watch.until_phase(AttemptPhase.EXITED)
    print("\nlaunch() call, launch->both processes started, launch->seen by poll (s):")
    for sample in samples:
        print("  " + ", ".join(f"{x:.3f}" for x in sample))
    # launch() does not wait: it returned before either rank's process started (or within
    # half a second, where a rank starts that fast)
    assert all(launch_s < max(started_s, 0.5) for launch_s, started_s, _ in samples), samples
    # ~0.7 s on an idle 2-core machine (Ray starts one fresh worker process per rank actor);
    # a loose bound, since the number depends on how loaded the machine is
    assert min(started for _, started, _ in samples) < 15.0


def test_executor_works_from_a_background_thread(ray_executor: RayExecutor, run) -> None:
    results: dict[str, object] = {}

    def control_loop() -> None:
        launch = make_launch(ray_executor, {}, ("python", "-c", "print('bg')"), workers=1)
        watch = run(launch)
        results["status"] = watch.until_phase(AttemptPhase.EXITED)
        results["log"] = watch.text(0)

    thread = threading.Thread(target=control_loop)
    thread.start()
    thread.join(timeout=60)

    assert results["log"] == "bg\n"


def test_executor_reconnects_after_someone_else_shuts_ray_down(
    ray_executor: RayExecutor, run
) -> None:
    import ray

    watch = run(make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py")))
    watch.until_phase(AttemptPhase.RUNNING)

    ray.shutdown()  # e.g. another component of the process that used Ray and left

    assert watch.poll().phase == AttemptPhase.RUNNING
    assert watch.attempt_key in ray_executor.live_attempts()


OTHER_DEPLOYMENT = """
import sys, time
from tests.fixtures.ray_cluster import Watch
from tests.adapters.test_ray_executor import make_launch
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.service.ports import AttemptPhase

address, namespace, key = sys.argv[1:4]
executor = RayExecutor(address, namespace=namespace, fail_fast_grace_s=5.0)
script = {"main.py": "import os\\nprint('namespace', os.environ['USER_VAR'])\\n"}
executor.launch(make_launch(executor, script, ("python", "main.py"), workers=1, key=key))
try:
    watch = Watch(executor, key)
    status = watch.until_phase(AttemptPhase.EXITED, timeout_s=120)
    print("exit codes", [r.exit_code for r in status.ranks], watch.text(0).strip())
finally:
    executor.release(key)
print("after release", executor.poll(key, {}).phase.name)
"""


def test_two_deployments_in_their_own_namespaces_run_attempts_of_the_same_key(
    ray_executor: RayExecutor, ray_address: str, run
) -> None:
    """Two servers on one Ray cluster (``ray_namespace``; a process talks to Ray in one
    namespace) both name their first attempt t1-a1: each runs and releases its own, and
    neither takes or removes the other's."""
    key = new_attempt_key("same")
    script = {"main.py": "import os\nprint('namespace', os.environ['USER_VAR'])\n"}
    mine = run(make_launch(ray_executor, script, ("python", "main.py"), workers=1, key=key))
    other = subprocess.run(
        [sys.executable, "-c", OTHER_DEPLOYMENT, ray_address, f"{TEST_NAMESPACE}-other", key],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert other.returncode == 0, other.stdout[-2000:] + other.stderr[-3000:]
    assert "exit codes [0] namespace hello" in other.stdout, other.stdout
    assert "after release UNKNOWN" in other.stdout, other.stdout  # gone from its namespace
    status = mine.until_phase(AttemptPhase.EXITED, timeout_s=120)  # still here, and its own
    assert [r.exit_code for r in status.ranks] == [0], (status, mine.text(0))
    assert "namespace hello" in mine.text(0)
    assert ray_executor.poll(key, {}).phase is AttemptPhase.EXITED
