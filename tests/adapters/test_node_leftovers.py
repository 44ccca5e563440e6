"""What a rank actor killed outright leaves on its node (its cgroup, its attempt's network
namespace name) is swept; what a living actor holds is not. Real Ray, real bwrap, real kernel."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch, make_context, new_attempt_key
from trainhub.adapters import node_leftovers
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.core.isolation import NodeIsolation
from trainhub.service.ports import AttemptLaunch, AttemptPhase

pytestmark = pytest.mark.ray


def _problem() -> str | None:
    from trainhub.adapters.cgroups import cgroup_problem
    from trainhub.adapters.sandbox import bwrap_problem
    from trainhub.adapters.trial_network import network_problem

    for check in (bwrap_problem, cgroup_problem, network_problem):
        problem = check()
        if problem:
            return problem
    return None


def _held() -> dict[str, dict[str, object]]:
    found = {}
    for path in node_leftovers.HELD_DIR.glob("*"):
        try:
            found[path.name] = json.loads(path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            continue
    return found


def _runs_this_test(held: dict[str, object]) -> bool:
    """A held cgroup whose processes include this test's rank (its argv prints 'UP')."""
    folders = [Path(str(f)) for f in held["cgroup"]]  # type: ignore[union-attr]
    with contextlib.suppress(OSError):
        for pid in (folders[0] / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                if b"print('UP'" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
    return False


def _network_of(attempt_key: str) -> str:
    """The attempt's network namespace: named by its placement group (containment.py)."""
    from ray.util.placement_group import get_placement_group

    return f"th-{get_placement_group(attempt_key).id.hex()}"


def test_the_cgroup_and_network_of_a_killed_rank_actor_are_swept(ray_address: str) -> None:
    problem = _problem()
    if problem:
        pytest.skip(problem)
    executor = RayExecutor(
        ray_address,
        namespace=TEST_NAMESPACE,
        sandbox="bwrap",
        isolation=NodeIsolation(seccomp=False),
    )
    before = set(_held())
    key = new_attempt_key("sweep")
    node = executor.cluster_nodes()[0].node_id
    executor.launch(
        AttemptLaunch(
            attempt_key=key,
            trial_id=9,
            attempt=1,
            argv=("python", "-c", "import time; print('UP', flush=True); time.sleep(120)"),
            context_archive=make_context({"x.txt": "x"}),
            env={},
            placement=(node,),
            cpus_per_worker=0.5,
            memory_gb_per_worker=0.5,
        )
    )
    watch = Watch(executor, key)
    try:
        watch.until(lambda s: "UP" in watch.text(0), timeout_s=120)
        # other pytest workers' ranks hold theirs meanwhile: pick this attempt's
        mine = {n: w for n, w in _held().items() if n not in before}
        cgroup_name, cgroup = next(
            (n, w) for n, w in mine.items() if "cgroup" in w and _runs_this_test(w)
        )
        netns_name, netns = next(
            (n, w) for n, w in mine.items() if w.get("netns") == _network_of(key)
        )
        ours = {cgroup_name, netns_name}
        folders = [Path(str(f)) for f in cgroup["cgroup"]]  # type: ignore[union-attr]
        netns_path = Path("/run/netns") / str(netns["netns"])
        assert all(f.exists() for f in folders)
        assert netns_path.exists()
        # a sweep leaves what a living actor holds
        swept = node_leftovers.sweep()
        assert not set(swept) & ours, swept
        assert all(f.exists() for f in folders)
        # the rank's process is in its cgroup; its parent is the rank actor: SIGKILL it
        pid = int((folders[0] / "cgroup.procs").read_text().split()[0])
        actor = psutil.Process(pid).parent()
        assert actor is not None
        while actor.name() == "bwrap":  # bwrap's own processes, then the actor
            parent = actor.parent()
            assert parent is not None
            actor = parent
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the rank dies with its actor (PDEATHSIG)
            if not (folders[0] / "cgroup.procs").read_text().split():
                break
            time.sleep(0.1)
        assert all(f.exists() for f in folders)  # nobody removed them: the actor is dead
        swept = node_leftovers.sweep()
        assert ours <= set(swept), (swept, ours)
        assert not any(f.exists() for f in folders)
        assert not netns_path.exists()
        assert not ours & set(_held())
        watch.until_phase(AttemptPhase.LOST, AttemptPhase.EXITED, timeout_s=60)
    finally:
        executor.release(key)
