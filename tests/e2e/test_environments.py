"""Trial environments end to end: a real server, real Ray, real uv, the real sandbox.

A trial imports a package the base environment lacks, from its requirements.txt; two trials
submitted together build the environment once, a later one reuses it (asserted from the
environment's record); a requirement that does not resolve fails the trial once, naming the
package; a trial cannot write to its environment. Skipped where no package index answers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.control_plane import ControlPlaneProcess
from trainhub.adapters.sandbox import bwrap_problem

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "environment_workload"
PACKAGE = "inflection"  # tiny, pure Python, not in the base environment


def _index_problem() -> str | None:
    index = os.environ.get("UV_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        response = httpx.get(f"{index}/{PACKAGE}/", timeout=10, follow_redirects=True)
    except httpx.HTTPError as exc:
        return f"no package index answers at {index}: {exc}"
    if response.status_code != 200:
        return f"the package index at {index} answers {response.status_code} for {PACKAGE}"
    return None


def spec(name: str, environment: dict[str, Any], variables: dict[str, str] | None = None) -> str:
    return json.dumps(
        {
            "name": name,
            "entrypoint": "python train.py",
            "resources": {"workers": 1, "cpus_per_worker": 1},
            "max_restarts": 2,
            "environment": {**environment, "variables": variables or {}},
        }
    )


@pytest.fixture(scope="module")
def plane(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlaneProcess]:
    problem = _index_problem()
    if problem is not None:
        pytest.skip(problem)
    if _uv_missing():
        pytest.skip("uv is not installed in this environment (pip install uv)")
    home = tmp_path_factory.mktemp("envs-home")
    sandbox = "bwrap" if bwrap_problem() is None else "none"
    # a private uv cache: the first build here is cold, as on a new node
    server = ControlPlaneProcess(
        home,
        ray_address,
        settings={"sandbox": sandbox},
        env={"UV_CACHE_DIR": str(home / "uv-cache")},
    )
    server.start()
    try:
        yield server
    finally:
        for experiment in server.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                server.request("POST", f"/experiments/{experiment['id']}/cancel")
        server.stop()


def _uv_missing() -> bool:
    try:
        from uv import find_uv_bin

        find_uv_bin()
    except Exception:
        return shutil.which("uv") is None
    return False


def _environments(plane: ControlPlaneProcess) -> list[dict[str, Any]]:
    response = plane.request("GET", "/environments")
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def _events(plane: ControlPlaneProcess, trial_id: int) -> list[str]:
    trial = plane.trial(trial_id)
    return [e["message"] for e in trial.get("events", [])]


def test_trials_import_their_packages_building_the_environment_once(
    plane: ControlPlaneProcess,
) -> None:
    environment = {"requirements": "requirements.txt"}
    first = plane.submit(spec("env-a", environment), WORKLOAD)["trials"][0]["id"]
    second = plane.submit(spec("env-b", environment), WORKLOAD)["trials"][0]["id"]
    # while it builds the trials wait in the queue, saying so, holding no slot
    waiting = plane.wait_for(
        first,
        lambda t: "environment" in (t.get("pending_reason") or "") or t["state"] != "QUEUED",
        what="building or started",
    )
    assert waiting["state"] in ("QUEUED", "SCHEDULED", "RUNNING", "COMPLETED")
    for trial_id in (first, second):
        done = plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
        assert done["num_attempts"] == 1
        log = plane.log(trial_id, 0)
        assert "INFLECTION" in log, log
        assert "EnvOk" in log, log
    (record,) = [e for e in _environments(plane) if e["requirements"] == ["inflection==0.5.1"]]
    assert record["state"] == "ready"
    assert record["num_builds"] == 1  # two trials at once: one build
    assert record["num_uses"] == 2
    assert record["packages"] == ["inflection==0.5.1"]  # torch and trainhub are the base's
    assert record["size_bytes"] > 0
    assert record["nodes"]

    # a later trial with the same requirements starts without a build
    third = plane.submit(spec("env-c", environment), WORKLOAD)["trials"][0]["id"]
    plane.wait_for(third, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    (again,) = [e for e in _environments(plane) if e["request_key"] == record["request_key"]]
    assert again["num_builds"] == 1
    assert again["num_uses"] == 3
    assert any("cached" in m for m in _events(plane, third)), _events(plane, third)

    # the build log, as `trainhub logs TRIAL --env` prints it
    found = plane.request("GET", f"/trials/{third}/environment").json()
    assert "inflection" in found["build_log"]
    assert found["key"] == record["key"]


def test_a_requirement_that_does_not_resolve_fails_the_trial_once(
    plane: ControlPlaneProcess,
) -> None:
    missing = "trainhub-no-such-package-4711"
    trial_id = plane.submit(spec("env-bad", {"packages": [f"{missing}==1.0"]}), WORKLOAD)["trials"][
        0
    ]["id"]
    failed = plane.wait_for(trial_id, lambda t: t["state"] == "FAILED", what="FAILED")
    assert missing in (failed["message"] or ""), failed
    assert failed["num_attempts"] == 0  # no attempt: no slot was held
    assert failed["num_restarts"] == 0
    assert plane.request("GET", "/trials/1").status_code == 200  # the server is healthy
    (record,) = [e for e in _environments(plane) if e["requirements"] == [f"{missing}==1.0"]]
    assert record["state"] == "failed"
    assert missing in record["error"]


def test_a_trial_cannot_write_to_its_environment(plane: ControlPlaneProcess) -> None:
    if bwrap_problem() is not None and os.geteuid() == 0:
        pytest.skip(f"no sandbox here ({bwrap_problem()}) and root ignores file modes")
    trial_id = plane.submit(
        spec("env-write", {"requirements": "requirements.txt"}, {"WRITE_ENV": "1"}), WORKLOAD
    )["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    log = plane.log(trial_id, 0)
    assert "WROTE" not in log, log
    assert log.count("REFUSED") == 2, log


def test_submit_refuses_a_missing_file_and_another_torch(
    plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    headers = {"Authorization": f"Bearer {plane.token}"}
    from tests.fixtures.control_plane import pack_dir

    def post(text: str) -> httpx.Response:
        return httpx.post(
            f"{plane.url}/api/v1/experiments",
            headers=headers,
            data={"spec": text},
            files={"context": ("c.tar.gz", pack_dir(code), "application/gzip")},
            timeout=30,
        )

    missing = post(spec("no-file", {"requirements": "deps/requirements.txt"}))
    assert missing.status_code == 422, missing.text
    (error,) = missing.json()["errors"]
    assert error["path"] == "environment.requirements"
    assert "deps/requirements.txt" in error["message"]

    torch = post(spec("old-torch", {"packages": ["einops", "torch==1.13.1"]}))
    assert torch.status_code == 422, torch.text
    (error,) = torch.json()["errors"]
    assert error["path"] == "environment.packages[1]"
    assert "torch" in error["message"]
    assert "cannot be replaced" in error["message"]
