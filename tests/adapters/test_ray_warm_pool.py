"""The warm pool against a real local Ray head: a fresh process per rank forked before any user
code ran, no slot held, size 0 runs no pool, and the ranks it must not serve start cold."""

from __future__ import annotations

import json
import os
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor, warm_pool
from trainhub.service.ports import AttemptLaunch, AttemptPhase

pytestmark = pytest.mark.ray

# what the rank finds at its very first line: torch already imported means a warm start; a
# module attribute the previous rank set would mean state leaked between ranks
PROBE = textwrap.dedent(
    """
    import json, os, sys
    preloaded = "torch" in sys.modules
    import torch
    leaked = getattr(torch, "_left_by_an_earlier_rank", None)
    torch._left_by_an_earlier_rank = os.environ["TRAINHUB_TRIAL_ID"]
    marks = json.loads(os.environ.get("TRAINHUB_STARTUP_MARKS", "{}"))
    print("PROBE " + json.dumps({"pid": os.getpid(), "preloaded": preloaded,
        "leaked": leaked, "warm": marks.get("warm", False), "rank": os.environ["RANK"],
        "cwd": os.getcwd(), "argv": sys.argv, "pgid": os.getpgid(0)}), flush=True)
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


def launch(
    executor: RayExecutor, trial_id: int, env: dict[str, str] | None = None, **kw: object
) -> AttemptLaunch:
    node = executor.cluster_nodes()[0].node_id
    return AttemptLaunch(
        attempt_key=new_attempt_key("warm"),
        trial_id=trial_id,
        attempt=1,
        argv=("python", "probe.py", "--flag"),
        context_archive=make_context({"probe.py": PROBE}),
        env={"TRAINHUB_TRIAL_ID": str(trial_id), **(env or {})},
        placement=(node, node),
        **kw,  # type: ignore[arg-type]
    )


def run_probe(
    executor: RayExecutor, attempt: AttemptLaunch, every_rank: bool = True
) -> tuple[list[dict], object]:
    """Run the probe; ``every_rank=False`` where a rank may be stopped before it started (a
    peer that failed first stops the gang, as torchrun does)."""
    executor.launch(attempt)
    try:
        watch = Watch(executor, attempt.attempt_key)
        status = watch.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=120)
        probes = []
        for rank in (0, 1):
            lines = [ln for ln in watch.text(rank).splitlines() if ln.startswith("PROBE ")]
            assert lines or not every_rank, watch.text(rank)
            probes.extend(json.loads(line[6:]) for line in lines[:1])
        return probes, status
    finally:
        executor.release(attempt.attempt_key)


@pytest.fixture
def warm_executor(ray_executor: RayExecutor, ray_address: str):
    executor = RayExecutor(
        ray_address, namespace=TEST_NAMESPACE, fail_fast_grace_s=5.0, warm_pool_size=2
    )
    import ray

    handles = warm_pool.ensure_pools(TEST_NAMESPACE, None, 2)
    assert handles
    assert all(ray.get([h.ready.remote() for h in handles], timeout=120))
    yield executor
    warm_pool.stop_pools(TEST_NAMESPACE)


def test_every_rank_is_a_fresh_process_forked_before_any_user_code(
    warm_executor: RayExecutor,
) -> None:
    first, status = run_probe(warm_executor, launch(warm_executor, 101))
    assert status.phase == AttemptPhase.EXITED
    assert all(r.exit_code == 0 for r in status.ranks)
    second, _ = run_probe(warm_executor, launch(warm_executor, 102))
    probes = first + second
    assert all(p["preloaded"] and p["warm"] for p in probes), probes  # torch came imported
    assert len({p["pid"] for p in probes}) == 4  # one process per rank, never reused
    assert all(p["leaked"] is None for p in probes)  # no rank sees another's state
    assert all(p["pgid"] == p["pid"] for p in probes)  # its own group: signals reach the tree
    assert all(p["argv"] == ["probe.py", "--flag"] for p in probes)
    assert all(p["cwd"].endswith("/code") for p in probes)


def test_a_warm_rank_exit_code_reaches_the_executor(warm_executor: RayExecutor) -> None:
    probes, status = run_probe(
        warm_executor, launch(warm_executor, 103, {"EXIT_CODE": "3"}), every_rank=False
    )
    assert probes
    assert all(p["warm"] for p in probes)
    assert status.phase == AttemptPhase.EXITED
    assert 3 in [r.exit_code for r in status.ranks]


def test_the_pool_holds_no_slot(warm_executor: RayExecutor) -> None:
    deadline = time.monotonic() + 10
    while True:
        nodes = warm_executor.cluster_nodes()
        if all(n.free_cpus == n.total_cpus for n in nodes) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(n.free_cpus == n.total_cpus for n in nodes), nodes
    assert all(n.free_gpus == n.total_gpus for n in nodes), nodes


def test_a_trial_with_its_own_environment_starts_cold(
    warm_executor: RayExecutor, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3" / "site-packages").mkdir(parents=True)
    probes, status = run_probe(warm_executor, launch(warm_executor, 104, environment_dir=str(venv)))
    assert status.phase == AttemptPhase.EXITED
    assert not any(p["preloaded"] or p["warm"] for p in probes), probes


def test_size_zero_runs_no_pool_and_ranks_start_cold(
    ray_executor: RayExecutor, ray_address: str
) -> None:
    warm_pool.ensure_pools(TEST_NAMESPACE, None, 1)
    RayExecutor(ray_address, namespace=TEST_NAMESPACE, warm_pool_size=0)  # stops them
    import ray

    names = [  # control planes of other tests keep pools in namespaces of their own
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == TEST_NAMESPACE
    ]
    assert not any(n.startswith(warm_pool.ACTOR_PREFIX) for n in names)
    probes, _ = run_probe(ray_executor, launch(ray_executor, 105))
    assert not any(p["preloaded"] or p["warm"] for p in probes), probes


def test_what_the_pool_must_not_serve() -> None:
    python = ("python", "train.py")
    assert warm_pool.cold_reason(python, "none", None) is None
    # a sandboxed rank: warm from a root agent's zygote (warm_sandbox.py), CPU ranks only
    assert warm_pool.cold_reason(python, "bwrap", None, root=True) is None
    assert "unprivileged" in (warm_pool.cold_reason(python, "bwrap", None, root=False) or "")
    assert "GPU" in (warm_pool.cold_reason(python, "bwrap", None, gpus=True, root=True) or "")
    assert "environment" in (warm_pool.cold_reason(python, "none", "/envs/x") or "")
    for argv in (("torchrun", "train.py"), ("python", "-m", "pkg"), ("python", "-u", "t.py")):
        assert warm_pool.cold_reason(argv, "none", None) is not None


def test_a_sandboxed_executor_runs_a_pool_where_its_agent_is_root(ray_address: str) -> None:
    try:
        executor = RayExecutor(
            ray_address, namespace=TEST_NAMESPACE, sandbox="bwrap", warm_pool_size=4
        )
        assert executor.warm_pool_size == (4 if os.geteuid() == 0 else 0)
    finally:
        warm_pool.stop_pools(TEST_NAMESPACE)


def test_a_warm_rank_is_terminated_like_a_cold_one(warm_executor: RayExecutor) -> None:
    sleeper = "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(300)\n"
    attempt = replace(
        launch(warm_executor, 106), context_archive=make_context({"probe.py": sleeper})
    )
    warm_executor.launch(attempt)
    try:
        watch = Watch(warm_executor, attempt.attempt_key)
        watch.until(lambda s: all("PID" in watch.text(r) for r in (0, 1)), timeout_s=120)
        warm_executor.terminate(attempt.attempt_key, grace_s=2.0)
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=60)
        assert all(r.exit_code is not None and r.exit_code < 0 for r in status.ranks), status
    finally:
        warm_executor.release(attempt.attempt_key)


FORKER = textwrap.dedent(
    """
    import os, time
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print("PIDS", os.getpid(), child, flush=True)
    time.sleep(120)
    """
)


def test_node_monitoring_finds_a_warm_rank_and_what_it_forked(warm_executor: RayExecutor) -> None:
    import psutil

    from trainhub.adapters.monitor.sampler import NodeSampler

    attempt = replace(
        launch(warm_executor, 106), context_archive=make_context({"probe.py": FORKER})
    )
    warm_executor.launch(attempt)
    try:
        watch = Watch(warm_executor, attempt.attempt_key)
        watch.until(lambda s: all("PIDS" in watch.text(r) for r in (0, 1)), timeout_s=120)
        pids = [int(p) for r in (0, 1) for p in watch.text(r).split("PIDS ")[1].split()[:2]]
        # what the processes' own environment says: the zygote's, without the trial
        assert all(psutil.Process(p).environ().get("TRAINHUB_TRIAL_ID") != "106" for p in pids)
        for pid in pids:
            assert (warm_pool.warm_rank_environment(pid) or {}).get("TRAINHUB_TRIAL_ID") == "106"
        sampler = NodeSampler("node")
        sampler.sample()
        time.sleep(0.3)
        usage = sampler.sample().trials
        assert 106 in usage, usage
        assert usage[106][1] > 0  # resident memory of the ranks and their children
        ranks = [pids[0], pids[2]]
    finally:
        warm_executor.release(attempt.attempt_key)
    deadline = time.monotonic() + 10
    while any(r in warm_pool.registered_ranks() for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(r in warm_pool.registered_ranks() for r in ranks)  # unregistered when reaped
