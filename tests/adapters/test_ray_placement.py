"""RayExecutor on a three-node Ray cluster (``ray.cluster_utils.Cluster``: several raylets on
this machine): exact per-rank placement, torchrun variables across nodes, labels, node loss.

The cluster runs in a child process, because this test process may already be connected to
the session's single-node head (a process joins one Ray cluster only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ENV_KEYS = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR")


def scenario() -> None:
    """Run in a child process: prints one JSON line with what the test checks."""
    import ray
    import ray._private.utils
    from ray.cluster_utils import Cluster

    from tests.fixtures.ray_cluster import Watch, make_context, new_attempt_key
    from trainhub.adapters.ray_executor import RayExecutor
    from trainhub.adapters.ray_executor.local_cluster import ensure_auth_token
    from trainhub.core.spec import Placement
    from trainhub.service.ports import AttemptLaunch, AttemptPhase

    ensure_auth_token()  # RAY_AUTH_MODE=token is set by the parent: Ray reads it at import
    # Cluster() advertises itself in /tmp/ray/ray_current_cluster, where a plain ray.init() of
    # anyone else on this machine would find it: keep it to ourselves
    ray._private.utils.write_ray_address = lambda *args, **kwargs: None
    temp_dir = tempfile.mkdtemp(prefix="th-pl-", dir="/tmp")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "temp_dir": temp_dir},
    )
    second = cluster.add_node(num_cpus=2, labels={"zone": "a"})
    cluster.add_node(num_cpus=2, labels={"zone": "b"})
    cluster.wait_for_nodes()
    result: dict[str, object] = {}
    try:
        executor = RayExecutor(cluster.address, namespace="placement-test")
        nodes = {n.node_id: n for n in executor.cluster_nodes()}
        result["labels"] = sorted(n.labels.get("zone", "") for n in nodes.values())
        head = cluster.head_node.node_id
        zone_a = next(i for i, n in nodes.items() if n.labels.get("zone") == "a")
        zone_b = next(i for i, n in nodes.items() if n.labels.get("zone") == "b")
        assert second.node_id == zone_a

        # ranks pinned where PACK would never put them: b, a, b, head
        placement = (zone_b, zone_a, zone_b, head)
        script = (
            "import json, os\n"
            f"print(json.dumps({{k: os.environ[k] for k in {list(ENV_KEYS)!r}}}))\n"
        )
        key = new_attempt_key("pin")
        executor.launch(
            AttemptLaunch(
                attempt_key=key,
                trial_id=1,
                attempt=1,
                argv=("python", "main.py"),
                context_archive=make_context({"main.py": script}),
                env={},
                placement=placement,
                cpus_per_worker=0.5,
            )
        )
        watch = Watch(executor, key)
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=120)
        result["pinned_nodes"] = [r.node_id == placement[r.rank] for r in status.ranks]
        result["exit_codes"] = [r.exit_code for r in status.ranks]
        result["env"] = [json.loads(watch.text(r).splitlines()[0]) for r in range(4)]
        executor.release(key)

        # a node dies under a running attempt
        key = new_attempt_key("loss")
        executor.launch(
            AttemptLaunch(
                attempt_key=key,
                trial_id=2,
                attempt=1,
                argv=("python", "-c", "import time; print('up', flush=True); time.sleep(300)"),
                context_archive=b"",
                env={},
                placement=(zone_b, zone_a),
                strategy=Placement.SPREAD,
            )
        )
        watch = Watch(executor, key)
        watch.until(lambda s: all("up" in watch.text(r) for r in (0, 1)), timeout_s=120)
        started = time.monotonic()
        cluster.remove_node(second)
        status = watch.until_phase(AttemptPhase.LOST, timeout_s=120)
        result["loss_s"] = round(time.monotonic() - started, 2)
        result["loss_ranks"] = [r.phase.value for r in status.ranks]
        result["alive_nodes"] = len(executor.cluster_nodes())
        executor.release(key)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    print("RESULT " + json.dumps(result))


def test_exact_placement_env_and_node_loss_on_three_nodes() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.adapters.test_ray_placement import scenario; scenario()",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"scenario failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    print(f"\nnode loss seen as LOST after {result['loss_s']} s")

    assert result["labels"] == ["", "a", "b"]
    assert result["pinned_nodes"] == [True] * 4
    assert result["exit_codes"] == [0] * 4
    by_rank = result["env"]
    # nodes in order of their first rank: zone b is group 0, zone a group 1, the head group 2
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) for e in by_rank] == [
        ("0", "2", "0"),
        ("0", "1", "1"),
        ("1", "2", "0"),
        ("0", "1", "2"),
    ]
    assert all(e["NODE_RANK"] == e["GROUP_RANK"] for e in by_rank)
    assert len({e["MASTER_ADDR"] for e in by_rank}) == 1
    assert result["loss_ranks"] == ["running", "lost"]
    assert result["alive_nodes"] == 2
