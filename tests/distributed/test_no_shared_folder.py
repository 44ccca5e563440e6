"""A cluster with no shared folder (issue 25, item 4; ADR 0034): a control plane and two Ray
worker nodes, each in a network namespace of its own with private folders no other host sees
(tests/distributed/private_nodes.py), storage in an S3 bucket (SeaweedFS) only the control
plane reaches. A two-rank trial that needs an environment (installed from a package index on
the network), a dataset and its checkpoints runs on one node; that node is killed; the trial
resumes from its checkpoint on the other node and completes, its logs and metrics whole.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.distributed.netns import unavailable_reason
from tests.distributed.noshare_driver import STEPS
from tests.distributed.private_nodes import CP_IP, private_cluster

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.e2e]

REASON = unavailable_reason()
WHEELS_PORT = 8701  # on the control-plane host's own network stack: nothing else binds there


@pytest.mark.skipif(REASON is not None, reason=f"private hosts: {REASON}")
def test_a_trial_resumes_on_another_node_with_nothing_shared_but_the_bucket() -> None:
    uv = {"UV_INDEX_URL": f"http://{CP_IP}:{WHEELS_PORT}/simple"}  # every host's index
    with private_cluster(workers=2, cpus_per_node=2, env=uv) as cluster:
        n1, n2 = cluster.workers
        private = ":".join(
            [str(cluster.control.home), str(n1.work), str(n2.work), str(cluster.control.folder)]
        )
        lines = cluster.run_driver(
            [
                "-m", "tests.distributed.noshare_driver",
                "--root", str(cluster.control.folder),
                "--ray-address", cluster.ray_address,
                "--ip", CP_IP,
                "--wheels-port", str(WHEELS_PORT),
                "--nodes", json.dumps({h.ip: h.namespace for h in cluster.workers}),
                "--private", private,
            ],
            timeout_s=1200,
        )  # fmt: skip
        started = next(line for line in lines if line["event"] == "started")
        result = next(line for line in lines if line["event"] == "result")
        first = cluster.worker_by_ip(str(started["ip"]))
        second = n2 if first is n1 else n1
        # each node installed the environment in its own cache (the control plane in none)
        for node in (first, second):
            installed = list((node.work / "envs").glob("*/.trainhub-ready"))
            assert len(installed) == 1, (node.name, installed)
        assert not (cluster.control.home / "trainhub" / "envs").exists()

    trial = result["trial"]
    assert isinstance(trial, dict)
    assert trial["state"] == "COMPLETED", trial
    attempts = trial["attempts"]
    assert len(attempts) == 2, attempts
    assert attempts[0]["outcome"] == "LOST", attempts[0]
    assert attempts[1]["restored_checkpoint_id"] is not None
    logs = result["logs"]
    assert isinstance(logs, dict)
    # the first attempt ran on the killed node, the second on the other one
    assert result["placements"] == {"1": [first.ip], "2": [second.ip]}
    for attempt in (1, 2):
        for rank in (0, 1):
            said = logs[f"{attempt}/{rank}"]
            assert f"rank {rank}: hello from tinypkg, data says hello from the bucket" in said
    resumed = re.search(r"rank 0 resumed at step (\d+)", logs["2/0"])
    assert resumed is not None, logs["2/0"]
    restart_step = int(resumed.group(1))
    assert restart_step >= 4  # from the checkpoint of step 3 or a later one
    # the state came through the checkpoint: every step counted once, by both ranks
    assert f"rank 0 done: total {2 * STEPS}" in logs["2/0"]
    # a rank never sees another node's folder nor the control plane's
    for key, other in (("1/0", second), ("2/0", first)):
        assert f"SEES {other.work} False" in logs[key]
        assert f"SEES {cluster.control.home} False" in logs[key]
    # the environment was installed on the second node while the trial waited for it
    reasons = [str(r) for r in result["reasons"]]  # type: ignore[union-attr]
    assert any(r.startswith("building its environment") and " on node " in r for r in reasons), (
        reasons
    )
    # metrics whole: every step once the latest report of each step is kept
    metrics = result["metrics"]
    assert isinstance(metrics, list)
    assert sorted({int(p["step"]) for p in metrics}) == list(range(STEPS))
    # everything lived in the bucket: code, dataset, checkpoints, logs of both attempts
    keys = [str(k) for k in result["keys"]]  # type: ignore[union-attr]
    tenant = [k for k in keys if "/tenants/default/" in k]
    for part in ("/contexts/", "/checkpoints/", "/datasets/"):
        assert any(part in k for k in tenant), (part, keys)
    for attempt in (1, 2):
        for rank in (0, 1):
            assert any(k.endswith(f"attempt-{attempt}/rank-{rank}.log") for k in tenant), keys
    home_files = [str(f) for f in result["home_files"]]  # type: ignore[union-attr]
    assert not [f for f in home_files if f.startswith(("artifacts/", "envs/"))], home_files
