"""Tenants that cannot reach each other: a real trial tries every escape the issue lists.

One trial script (tests/e2e/escapes.py) tries to read the control plane's admin token, database,
home and storage, Ray's session folder and cluster token, other trials' files and processes,
and to use its trial token on another trial; every try must be refused. The trial token is
revoked when the attempt ends. Skipped where bwrap cannot sandbox a process here.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.escapes import ALLOCATE, ATTACKS, BUSY, NEIGHBOUR, SCRIPT, parse
from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir
from trainhub.adapters.ray_executor.local_cluster import read_record
from trainhub.adapters.sandbox import bwrap_problem

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

EXPECTED = {
    "read_admin_token",
    "read_database_file",
    "list_control_plane_home",
    "list_storage_root",
    "list_other_trials_checkpoints",
    "list_node_work_root",
    "list_ray_session_folder",
    "read_ray_token_file",
    "read_etc_shadow",
    "list_ray_folder_in_user_home",
    "ray_token_in_environment",
    "server_environment_inherited",
    "read_other_processes_environment",
    "see_other_processes",
    "signal_control_plane",
    "trial_token_reads_other_trial",
    "trial_token_lists_users",
}


def escape_spec(name: str, env: dict[str, str]) -> str:
    """The spec as JSON (which YAML reads as it is)."""
    spec = {
        "name": name,
        "entrypoint": "python escape.py",
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "max_restarts": 0,
        "environment": {"variables": env},
    }
    return json.dumps(spec)


def targets(plane: ControlPlaneProcess, ray_head: Path, other_trial: int) -> dict[str, str]:
    record = read_record(ray_head)
    assert record is not None
    assert plane.proc is not None
    return {
        "ESCAPE_HOME": str(plane.home),
        "ESCAPE_DB": str(plane.home / "trainhub.db"),
        "ESCAPE_STORAGE": str(plane.home / "artifacts"),
        "ESCAPE_WORK_ROOT": str(ray_head / "work"),
        "ESCAPE_CHECKPOINT_ROOT": str(plane.home / "artifacts" / "trial-checkpoints"),
        "ESCAPE_RAY_TEMP": record.temp_dir,
        "ESCAPE_RAY_TOKEN_FILE": str(Path.home() / ".ray" / "auth_token"),
        "ESCAPE_RAY_USER_DIR": str(Path.home() / ".ray"),
        "ESCAPE_SERVER_PID": str(plane.proc.pid),
        "ESCAPE_OTHER_TRIAL": str(other_trial),
    }


@pytest.fixture
def sandboxed_plane(ray_address: str, tmp_path: Path):
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    home = tmp_path / "home"
    home.mkdir()
    # a secret of the server's environment that no trial may inherit
    plane = ControlPlaneProcess(
        home, ray_address, settings={"sandbox": "bwrap"}, env={"CANARY_DB_PASSWORD": "hunter2"}
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_a_sandboxed_trial_reaches_nothing_of_others(
    sandboxed_plane: ControlPlaneProcess, ray_head: Path, tmp_path: Path
) -> None:
    plane = sandboxed_plane
    code = tmp_path / "code"
    code.mkdir()
    (code / "escape.py").write_text(SCRIPT)
    # a first trial whose files and token the second one aims at
    first = plane.submit(escape_spec("victim", targets(plane, ray_head, 0)), code)
    victim = first["trials"][0]["id"]
    plane.wait_for(victim, lambda t: t["state"] == "COMPLETED", what="COMPLETED", timeout_s=120)

    # as root, the escaper comes from the warm pool once its zygote listens (ADR 0048): the
    # same attacks against a process forked into its sandbox instead of exec'd there by bwrap
    warm = os.geteuid() == 0 and _pool_listens(ray_head / "work")
    second = plane.submit(escape_spec("escaper", targets(plane, ray_head, victim)), code)
    trial_id = second["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED", timeout_s=120)
    log = plane.log(trial_id, 0)
    results = parse(log)

    assert set(results) == EXPECTED, log
    allowed = {name: r["detail"] for name, r in results.items() if r["allowed"]}
    assert allowed == {}, log
    assert "OWN_SIGNALS 200" in log  # the token works for its own trial while it runs
    assert "ESCAPES DONE" in log
    assert f"WARM_START {warm}" in log

    # the checkpoint folder lived outside the sandbox, under the storage root, and retention
    # removed it when its trial ended (issue 24: it must not outlive the trial uncounted)
    # (removed right after the end is committed: the test may read COMPLETED a moment before)
    pattern = str(plane.home / "artifacts" / "trial-checkpoints" / "*" / "state.txt")
    deadline = time.monotonic() + 60
    while glob.glob(pattern) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert glob.glob(pattern) == []

    # the trial token is revoked once the attempt ended
    token = next(line.split()[1] for line in log.splitlines() if line.startswith("TRIAL_TOKEN"))
    response = httpx.get(
        f"{plane.url}/api/v1/trials/{trial_id}/signals",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 401


def _pool_listens(work_root: Path, timeout_s: float = 120.0) -> bool:
    """Await a zygote listening on the node's warm-pool socket (warm_pool.socket_path; the
    pool of an earlier control plane in the same Ray namespace serves this one too)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for found in work_root.glob("*/warm-pool.sock"):
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(1.0)
                probe.connect(str(found))  # the zygote reads no request and closes
                return True
        time.sleep(0.5)
    return False


def test_state_is_readable_by_the_server_user_only(sandboxed_plane: ControlPlaneProcess) -> None:
    home = sandboxed_plane.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "artifacts").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "trainhub.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "admin-token").stat().st_mode) == 0o600
    for extra in ("trainhub.db-wal", "trainhub.db-shm"):
        if (home / extra).exists():
            assert stat.S_IMODE((home / extra).stat().st_mode) == 0o600


def test_the_cluster_view_names_the_sandbox(sandboxed_plane: ControlPlaneProcess) -> None:
    cluster = sandboxed_plane.request("GET", "/cluster").json()
    assert cluster["sandbox"] == "bwrap"
    from trainhub.adapters.trial_tunnel import tunnel_problem

    # a node without nftables says so (trials across nodes keep its network), nothing else
    expected = [] if tunnel_problem() is None else ["trials that span nodes keep"]
    assert [w[: len("trials that span nodes keep")] for w in cluster["warnings"]] == expected


# --- containment (issue 24): resources, network, syscalls --------------------------------

ATTACKS_CONTAINED = {
    "fork_300",
    "fill_dev_shm",
    "connect_other_trials_store",
    "connect_other_trials_store_loopback",
    "connect_ray_gcs",
    "connect_ray_gcs_loopback",
    "connect_postgres",
    "connect_host_abstract_socket",
    "user_namespace_unshare",
    "user_namespace_syscall",
    "keyctl",
    "ptrace_attach_parent",
    "ptrace_seize_parent",
    "sys_cgroup_visible",
    "sys_net_visible",
}


def containment_problem() -> str | None:
    """Why this machine cannot contain a rank (the tests skip with it), or None."""
    from trainhub.adapters.cgroups import cgroup_problem
    from trainhub.adapters.seccomp import SeccompUnavailable, compiled_filter
    from trainhub.adapters.trial_network import network_problem
    from trainhub.core.isolation import DENIED_SYSCALLS

    for problem in (bwrap_problem(), cgroup_problem(), network_problem()):
        if problem:
            return problem
    try:
        compiled_filter(DENIED_SYSCALLS)
    except SeccompUnavailable as exc:
        return str(exc)
    return None


def trial_spec(name: str, entrypoint: str, resources: dict[str, object], **more: object) -> str:
    spec = {"name": name, "entrypoint": entrypoint, "resources": resources, **more}
    return json.dumps(spec)


def submit_as(plane: ControlPlaneProcess, tenant: str, text: str, context: Path) -> int:
    response = httpx.post(
        f"{plane.url}/api/v1/experiments",
        headers={"Authorization": f"Bearer {plane.token}"},
        data={"spec": text, "tenant": tenant},
        files={"context": ("context.tar.gz", pack_dir(context), "application/gzip")},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return int(response.json()["trials"][0]["id"])


def code_dir(root: Path, name: str, script: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / f"{name}.py").write_text(script)
    return folder


@pytest.fixture
def contained_plane(ray_address: str, tmp_path: Path):
    problem = containment_problem()
    if problem is not None:
        pytest.skip(f"ranks cannot be contained here: {problem}")
    home = tmp_path / "home"
    home.mkdir()
    # a low process limit (an admin's setting) so that 300 processes are past it
    plane = ControlPlaneProcess(
        home, ray_address, settings={"sandbox": "bwrap", "pids_per_rank": 128}
    )
    plane.start()
    try:
        for tenant in ("neighbour", "attacker"):
            response = plane.request("POST", "/tenants", json={"name": tenant})
            assert response.status_code == 201, response.text
        yield plane
    finally:
        for experiment in plane.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        plane.stop()


def start_neighbour(plane: ControlPlaneProcess, tmp_path: Path, steps: int) -> tuple[int, str]:
    """A two-rank trial of another tenant; returns its id and its store's ``host:port``."""
    code = code_dir(tmp_path, "neighbour", NEIGHBOUR)
    text = trial_spec(
        "neighbour",
        "python neighbour.py",
        {"workers": 2, "cpus_per_worker": 1, "memory_gb_per_worker": 2, "single_node": True},
        environment={"variables": {"NEIGHBOUR_STEPS": str(steps)}},
        max_restarts=0,
    )
    trial_id = submit_as(plane, "neighbour", text, code)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        store = [ln for ln in plane.log(trial_id, 0).splitlines() if ln.startswith("STORE ")]
        if store:
            return trial_id, store[0].split()[1]
        assert plane.trial(trial_id)["state"] not in ("FAILED", "CANCELED"), plane.log(trial_id, 0)
        time.sleep(0.5)
    raise AssertionError(f"the neighbour never rendezvoused: {plane.log(trial_id, 0)}")


def test_attacks_from_a_trial_are_contained_and_a_neighbour_completes(
    contained_plane: ControlPlaneProcess, ray_address: str, tmp_path: Path
) -> None:
    plane = contained_plane
    steps = 40
    neighbour, store = start_neighbour(plane, tmp_path, steps)
    # the store as it would be on the host (the neighbour's MASTER_PORT on this node)
    node_ip = ray_address.rsplit(":", 1)[0]
    store_port = store.rsplit(":", 1)[1]
    abstract = f"trainhub-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + abstract)
    listener.listen(8)
    try:
        code = code_dir(tmp_path, "attack", ATTACKS)
        text = trial_spec(
            "attacker",
            "python attack.py",
            {"workers": 1, "cpus_per_worker": 1, "memory_gb_per_worker": 0.5},
            environment={
                "variables": {
                    "ATTACK_SHM_MIB": "400",  # /dev/shm holds half the rank's 0.5 GiB
                    "ATTACK_STORE": f"{node_ip}:{store_port}",
                    "ATTACK_RAY": ray_address,
                    "ATTACK_ABSTRACT": abstract,
                }
            },
            max_restarts=0,
        )
        attacker = submit_as(plane, "attacker", text, code)
        plane.wait_for(attacker, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    finally:
        listener.close()
    log = plane.log(attacker, 0)
    results = parse(log)
    assert set(results) == ATTACKS_CONTAINED, log
    allowed = {name: r["detail"] for name, r in results.items() if r["allowed"]}
    assert allowed == {}, log
    assert "stopped at" in results["fork_300"]["detail"]
    assert "ATTACKS DONE" in log

    done = plane.wait_for(neighbour, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    assert done["num_restarts"] == 0
    points = plane.metrics(neighbour)
    assert [(p["step"], p["values"]["value"]) for p in points] == [
        (step, float(step)) for step in range(steps)
    ], points[:5]


def test_a_rank_past_its_memory_is_killed_in_its_cgroup_and_not_restarted_again(
    contained_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    plane = contained_plane
    code = code_dir(tmp_path, "allocate", ALLOCATE)
    text = trial_spec(
        "glutton",
        "python allocate.py",
        {"workers": 1, "cpus_per_worker": 1, "memory_gb_per_worker": 0.5},
        environment={"variables": {"ATTACK_ALLOCATE_MIB": "1536"}},
        max_restarts=3,
    )
    trial_id = submit_as(plane, "attacker", text, code)
    trial = plane.wait_for(trial_id, lambda t: t["state"] == "FAILED", what="FAILED")
    message = trial["message"]
    assert "rank 0 exceeded its 0.5 GiB memory limit: peak 0.5 GiB" in message, trial
    assert "previous attempt exceeded its memory limit at the same point" in message, trial
    assert len(trial["attempts"]) == 2, trial  # not max_restarts + 1: the second OOM ends it
    assert "ALLOCATED ALL" not in plane.log(trial_id, 0)
    assert trial["limits"]["memory"] == "0.5 GiB, no swap"
    assert trial["limits"]["processes"] == "128"
    # the control plane lives on: the kernel killed the rank in its cgroup only
    assert plane.proc is not None
    assert plane.proc.poll() is None


def test_busy_processes_get_their_cpu_share_and_no_more(
    contained_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    plane = contained_plane
    code = code_dir(tmp_path, "busy", BUSY)
    share = 0.5
    text = trial_spec(
        "busy",
        "python busy.py",
        {"workers": 1, "cpus_per_worker": share},
        environment={"variables": {"ATTACK_BUSY_S": "6", "ATTACK_BUSY_WORKERS": "3"}},
        max_restarts=0,
    )
    trial_id = submit_as(plane, "attacker", text, code)
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    line = next(ln for ln in plane.log(trial_id, 0).splitlines() if ln.startswith("BUSY "))
    numbers = dict(item.split("=") for item in line.split()[1:])
    cpu_s, wall_s = float(numbers["cpu_s"]), float(numbers["wall_s"])
    assert cpu_s <= 1.2 * share * wall_s, line  # 3 busy processes would take 3x the wall time
    if os.getloadavg()[0] < (os.cpu_count() or 1):  # a busy machine may give it less
        assert cpu_s >= 0.8 * share * wall_s, line
