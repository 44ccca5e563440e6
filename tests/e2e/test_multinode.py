"""End to end on several nodes: a real control plane process on a Ray cluster of three raylets
on this machine (``ray.cluster_utils.Cluster``: a CPU head and two nodes declaring 2 GPUs each).

Declared GPUs only reserve (torch has no CUDA here): trials run on CPU with gloo, but the
control plane places and accounts for them as GPU trials: pack vs spread placement, and fair
share preempting a tenant that borrows every GPU for a tenant with a guarantee, by checkpoint.

The cluster runs in a child process of its own and is separate from the session's Ray head:
this test process never joins it (a process joins one Ray cluster only), and the child shuts
it down when the module's tests are done.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.control_plane import REPO, ControlPlaneProcess, pack_dir

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

MNIST = REPO / "examples" / "mnist"
GPU_NODES = 2
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2


# -- the cluster, in a child process --


def serve_cluster(info_path: str) -> None:
    """Run in the child: start the cluster, write its address to ``info_path``, keep it up
    until stdin closes, then shut it down."""
    import ray._common.utils
    import ray._private.utils
    from ray.cluster_utils import Cluster

    from trainhub.adapters.ray_executor.local_cluster import _ensure_auth_token

    _ensure_auth_token()  # RAY_AUTH_MODE=token is set by the parent: Ray reads it at import
    # Cluster() advertises itself in /tmp/ray/ray_current_cluster (and deletes that file on
    # shutdown), where a plain ray.init() of anyone else on this machine would look: keep out
    ray._private.utils.write_ray_address = lambda *args, **kwargs: None
    ray._common.utils.reset_ray_address = lambda *args, **kwargs: None
    temp_dir = tempfile.mkdtemp(prefix="th-mn-", dir="/tmp")  # short: Ray's socket paths
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "temp_dir": temp_dir},
    )
    try:
        gpu_nodes = [
            cluster.add_node(num_cpus=CPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
            for _ in range(GPU_NODES)
        ]
        cluster.wait_for_nodes()
        head = cluster.head_node
        assert head is not None
        info = {
            "address": cluster.address,
            "head": head.node_id,
            "gpu_nodes": [n.node_id for n in gpu_nodes],
        }
        tmp = info_path + ".tmp"
        Path(tmp).write_text(json.dumps(info))
        os.replace(tmp, info_path)
        sys.stdin.read()  # until the test closes our stdin (or dies)
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass(frozen=True)
class GpuCluster:
    address: str
    head: str
    gpu_nodes: tuple[str, ...]


START_TRIES = 2  # a head that missed a deadline of Ray's under load starts again, once


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuCluster]:
    # src first: a worktree whose venv is installed from another checkout must test its own code
    pythonpath = os.pathsep.join([str(REPO / "src"), str(REPO)])
    env = {**os.environ, "PYTHONPATH": pythonpath, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    for attempt in range(1, START_TRIES + 1):
        workdir = tmp_path_factory.mktemp("multinode")
        info_path = workdir / "cluster.json"
        log_path = workdir / "cluster.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from tests.e2e.test_multinode import serve_cluster; "
                    f"serve_cluster({str(info_path)!r})",
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: nothing of it outlives the module
            )
        deadline = time.monotonic() + 120
        while not info_path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if info_path.exists():
            break
        _stop_cluster(proc)
        if attempt == START_TRIES:
            tail = log_path.read_text(errors="replace")[-3000:]
            pytest.skip(f"ray.cluster_utils.Cluster cannot start a 3-node cluster here: {tail}")
    info = json.loads(info_path.read_text())
    try:
        yield GpuCluster(info["address"], info["head"], tuple(info["gpu_nodes"]))
    finally:
        _stop_cluster(proc)


def _stop_cluster(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()  # the child shuts the cluster down
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    # whatever of its process group is left (the child's own id is the group's id)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


# -- a control plane on it --


@pytest.fixture
def plane(gpu_cluster: GpuCluster, tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    """A control plane with the fair-share policy, short protection times, on the cluster."""
    home = tmp_path / "home"
    home.mkdir()
    settings = {
        "policy": "fair",
        "min_run_time_s": 1.0,
        "preemption_cooldown_s": 0.0,
        "reclaim_rate": 0.0,  # a small cluster's reclaim budget would hold a second reclaim
    }
    control = ControlPlaneProcess(home, gpu_cluster.address, settings=settings)
    control.start()
    try:
        yield control
    finally:
        if control.proc and control.proc.poll() is None:
            experiments = control.request("GET", "/experiments").json().get("data", [])
            active = [e["id"] for e in experiments if e["state"] == "ACTIVE"]
            for experiment_id in active:
                control.request("POST", f"/experiments/{experiment_id}/cancel")
            deadline = time.monotonic() + 30
            while active and time.monotonic() < deadline:
                experiments = control.request("GET", "/experiments").json()["data"]
                active = [e["id"] for e in experiments if e["state"] == "ACTIVE"]
                time.sleep(0.5)
        control.stop()
        if os.environ.get("TRAINHUB_KEEP_TEST_LOGS"):
            print(control.log_tail(200))


RANKS_SCRIPT = """\
import json, os, socket
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")
print("RANKINFO " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""


def ranks_spec(name: str, placement: str, workers: int = 2) -> str:
    return yaml.safe_dump(
        {
            "name": name,
            "entrypoint": "python main.py",
            "resources": {
                "workers": workers,
                "gpus_per_worker": 1,
                "cpus_per_worker": 0.5,
                "placement": placement,
            },
        }
    )


def submit_as(
    plane: ControlPlaneProcess, token: str, tenant: str, spec: str, context: Path
) -> dict[str, Any]:
    import httpx

    r = httpx.post(
        f"{plane.url}/api/v1/experiments",
        headers={"Authorization": f"Bearer {token}"},
        data={"spec": spec, "tenant": tenant},
        files={"context": ("context.tar.gz", pack_dir(context), "application/gzip")},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_pack_uses_the_fewest_nodes_and_spread_different_nodes(
    plane: ControlPlaneProcess, gpu_cluster: GpuCluster, tmp_path: Path
) -> None:
    context = tmp_path / "ranks"
    context.mkdir()
    (context / "main.py").write_text(RANKS_SCRIPT)
    # one after the other on the idle cluster: spread is best effort (the policy puts ranks
    # round-robin on the nodes with room), so next to a running trial it may share a node
    done = {}
    for name in ("pack", "spread"):
        trial_id = plane.submit(ranks_spec(name, name), context)["trials"][0]["id"]
        done[name] = plane.wait_for(
            trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=90, what="COMPLETED"
        )
    pack, spread = done["pack"]["id"], done["spread"]["id"]
    gpu_nodes = set(gpu_cluster.gpu_nodes)

    (attempt,) = done["pack"]["attempts"]
    assert attempt["exit_codes"] == [0, 0]
    assert len(set(attempt["placement"])) == 1, attempt["placement"]  # 2 GPUs fit on one node
    assert set(attempt["placement"]) <= gpu_nodes  # never on the GPU-less head
    # each rank got a GPU of its own on that node
    ranks = [_rank_info(plane.log(pack, r)) for r in (0, 1)]
    assert [r["RANK"] for r in ranks] == ["0", "1"]
    assert [r["LOCAL_RANK"] for r in ranks] == ["0", "1"]
    devices = [r["CUDA_VISIBLE_DEVICES"] for r in ranks]
    assert None not in devices, devices
    # as torchrun: both ranks see the trial's two GPUs of the node, LOCAL_RANK picks its own
    assert devices[0] == devices[1], devices
    assert len(set(devices[0].split(","))) == 2, devices

    (attempt,) = done["spread"]["attempts"]
    assert attempt["exit_codes"] == [0, 0]
    assert set(attempt["placement"]) == gpu_nodes, attempt["placement"]  # one rank per node
    ranks = [_rank_info(plane.log(spread, r)) for r in (0, 1)]
    assert [(r["RANK"], r["LOCAL_RANK"]) for r in ranks] == [("0", "0"), ("1", "0")]


def _rank_info(log: str) -> dict[str, Any]:
    line = next((ln for ln in log.splitlines() if ln.startswith("RANKINFO ")), None)
    assert line is not None, log[-2000:]
    return dict(json.loads(line.removeprefix("RANKINFO ")))


# -- preemption --


def test_fair_share_preempts_a_borrowing_tenant_by_checkpoint_and_resumes_it(
    plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    for name, guaranteed in (("team-a", 0), ("team-b", GPUS_PER_NODE)):
        r = plane.request("POST", "/tenants", json={"name": name, "guaranteed_slots": guaranteed})
        assert r.status_code == 201, r.text
    tokens = {}
    for user, tenant in (("ann", "team-a"), ("ben", "team-b")):
        assert plane.request("POST", "/users", json={"username": user}).status_code == 201
        r = plane.request(
            "PUT", f"/users/{user}/memberships", json={"tenant": tenant, "role": "member"}
        )
        assert r.status_code == 200, r.text
        r = plane.request("POST", "/tokens", json={"username": user, "name": "e2e"})
        tokens[user] = r.json()["token"]

    # A borrows every GPU of the cluster: 2 ranks x 2 GPUs, one rank per node
    epochs = 10
    spec_a = yaml.safe_load((MNIST / "experiment.yaml").read_text())
    spec_a["name"] = "borrower"
    spec_a["resources"] = {"workers": 2, "gpus_per_worker": GPUS_PER_NODE, "cpus_per_worker": 1}
    spec_a["hyperparameters"].update(epochs=epochs, sleep_per_epoch_s=1.5)
    spec_a["environment"] = {"variables": {"TRAINHUB_SIGNALS_POLL_S": "1"}}
    a = submit_as(plane, tokens["ann"], "team-a", yaml.safe_dump(spec_a), MNIST)["trials"][0]["id"]
    plane.wait_for(
        a,
        lambda t: t["state"] == "RUNNING" and len(t["checkpoints"]) >= 1,
        timeout_s=120,
        what="RUNNING with a checkpoint",
    )

    # B, within its guarantee, needs 2 of the GPUs A holds
    context = tmp_path / "b"
    context.mkdir()
    (context / "main.py").write_text(RANKS_SCRIPT + "import time; time.sleep(2)\n")
    b = submit_as(plane, tokens["ben"], "team-b", ranks_spec("guaranteed", "pack"), context)
    b = b["trials"][0]["id"]

    history: list[tuple[float, str, str | None, str, str | None]] = []
    queue_output = ""
    started = time.monotonic()
    deadline = started + 150
    while True:
        ta, tb = plane.trial(a), plane.trial(b)
        row = (
            round(time.monotonic() - started, 1),
            ta["state"],
            ta["pending_reason"],
            tb["state"],
            tb["pending_reason"],
        )
        if not history or history[-1][1:] != row[1:]:
            history.append(row)
        if ta["state"] == "QUEUED" and ta["num_attempts"] == 1 and not queue_output:
            queue_output = _cli(plane, "queue")
        if ta["state"] == "COMPLETED" and tb["state"] == "COMPLETED":
            break
        if time.monotonic() > deadline or "FAILED" in (ta["state"], tb["state"]):
            raise AssertionError(
                "A (team-a, borrowing 4 GPUs) / B (team-b, guaranteed 2) went through "
                "(s, A state, A pending, B state, B pending):\n"
                + "\n".join(map(str, history))
                + f"\nA events: {[e['message'] for e in ta['events']]}"
                + f"\nserver: {plane.log_tail(60)}"
            )
        time.sleep(0.5)
    states_a = [h[1] for h in history]
    states_b = [h[3] for h in history]
    # A was preempted while B waited, went back to the queue, and B ran before A's return
    assert "PREEMPTING" in states_a, history
    preempting = states_a.index("PREEMPTING")
    assert "QUEUED" in states_a[preempting:], history
    first_b_run = next(i for i, s in enumerate(states_b) if s in ("SCHEDULED", "RUNNING"))
    assert first_b_run > preempting, history
    assert all(s in ("QUEUED", "PREEMPTING") for s in states_a[preempting : first_b_run + 1])

    ta, tb = plane.trial(a), plane.trial(b)
    assert tb["num_attempts"] == 1
    assert tb["attempts"][0]["outcome"] == "SUCCEEDED"
    first, second = ta["attempts"]
    assert first["outcome"] == "PREEMPTED", first
    assert second["outcome"] == "SUCCEEDED", second
    assert second["restored_checkpoint_id"] is not None
    assert ta["num_restarts"] == 0  # a preemption is not a failure
    preempt_events = [e["message"] for e in ta["events"] if e["kind"] == "preempting"]
    assert preempt_events, ta["events"]
    reason = preempt_events[0]
    # the runtime saw should_stop() with the scheduler's reason, after a checkpoint
    log_1 = plane.log(a, 0, attempt=1)
    assert f": {reason}" in next(
        (ln for ln in log_1.splitlines() if ln.startswith("stopping after epoch")), log_1[-2000:]
    )
    assert "resuming after epoch" in plane.log(a, 0, attempt=2)
    steps = [p["step"] for p in plane.metrics(a) if "val_accuracy" in p["values"]]
    assert steps == list(range(epochs))  # every epoch exactly once, across both attempts
    # `trainhub queue` showed A waiting after its preemption
    assert str(a) in queue_output, queue_output
    assert "team-a" in queue_output, queue_output

    usage = plane.request("GET", "/usage").json()
    used = {row["tenant"] for row in usage["data"] if row["slot_hours"] > 0}
    assert {"team-a", "team-b"} <= used, usage
    users = {row["user"] for row in usage["data"]}
    assert {"ann", "ben"} <= users
    shares = {t["tenant"]: t for t in usage["tenants"]}
    assert shares["team-b"]["guaranteed_slots"] == GPUS_PER_NODE
    assert shares["team-a"]["share_of_guarantee"] is None
    print(
        "\nfair share: "
        + "; ".join(f"{s}s A {sa} ({ra}) B {sb} ({rb})" for s, sa, ra, sb, rb in history)
    )


def _cli(plane: ControlPlaneProcess, *args: str) -> str:
    from trainhub.cli.main import app

    env = {"TRAINHUB_URL": plane.url, "TRAINHUB_TOKEN": plane.token, "COLUMNS": "250"}
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout
