"""Tenants that cannot reach each other: a real trial tries every escape the issue lists.

One trial script (tests/e2e/escapes.py) tries to read the control plane's admin token, database,
home and storage, Ray's session folder and cluster token, other trials' files and processes,
and to use its trial token on another trial; every try must be refused. The trial token is
revoked when the attempt ends. Skipped where bwrap cannot sandbox a process here.
"""

from __future__ import annotations

import glob
import json
import stat
from pathlib import Path

import httpx
import pytest

from tests.e2e.escapes import SCRIPT, parse
from tests.fixtures.control_plane import ControlPlaneProcess
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

    # the checkpoint folder lived outside the sandbox, under the storage root, and retention
    # removed it when its trial ended (issue 24: it must not outlive the trial uncounted)
    saved = glob.glob(str(plane.home / "artifacts" / "trial-checkpoints" / "*" / "state.txt"))
    assert saved == []

    # the trial token is revoked once the attempt ended
    token = next(line.split()[1] for line in log.splitlines() if line.startswith("TRIAL_TOKEN"))
    response = httpx.get(
        f"{plane.url}/api/v1/trials/{trial_id}/signals",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 401


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
    assert cluster["warnings"] == []
