"""The control plane's state beside the Python environment (issue 31, item 9).

A fresh clone keeps its ``.venv`` in the clone's folder; a server started there with
``--db sqlite:///$PWD/th.db`` used to deny the database's whole folder to the sandbox, so the
environment was not mounted and every rank exited 127. The sandbox now denies the database's
files, and the server refuses to start where the two cannot be separated.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.control_plane import REPO, ControlPlaneProcess
from trainhub.adapters.sandbox import bwrap_problem, environment_folders, sqlite_state_files
from trainhub.cli.main import app

MNIST = REPO / "examples" / "mnist"


def _no_sandbox() -> str | None:
    return bwrap_problem()


@pytest.fixture
def db_beside_venv() -> Iterator[Path]:
    """A database file in the folder that holds the running ``.venv`` (the checkout)."""
    venv = Path(environment_folders()[0])
    folder = venv.parent
    if not (folder / ".venv").exists():
        pytest.skip(f"the Python environment {venv} is not a .venv in a checkout")
    path = folder / f"th-test-{uuid.uuid4().hex[:8]}.db"
    try:
        yield path
    finally:
        for state in sqlite_state_files(str(path)):  # Optuna's sibling database too
            Path(state).unlink(missing_ok=True)


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_a_database_beside_the_venv_runs_a_sandboxed_trial_to_completion(
    ray_address: str, tmp_path: Path, db_beside_venv: Path
) -> None:
    problem = _no_sandbox()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlaneProcess(
        home, ray_address, db_url=f"sqlite:///{db_beside_venv}", settings={"sandbox": "bwrap"}
    )
    plane.start()
    try:
        spec = yaml.safe_load((MNIST / "experiment.yaml").read_text())
        spec["hyperparameters"]["epochs"] = 1
        spec["resources"]["workers"] = 1
        experiment = plane.submit(yaml.safe_dump(spec), MNIST)
        trial_id = experiment["trials"][0]["id"]
        trial = plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
        assert trial["num_attempts"] == 1
        assert trial["attempts"][0]["exit_codes"] == [0]
    finally:
        plane.stop()


def test_the_server_refuses_state_inside_the_environment_naming_both(tmp_path: Path) -> None:
    problem = _no_sandbox()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    folder = Path(environment_folders()[0])  # the interpreter's prefix (the .venv)
    database = folder / f"th-test-{uuid.uuid4().hex[:8]}.db"
    result = CliRunner().invoke(
        app,
        [
            "server",
            "--db",
            f"sqlite:///{database}",
            "--sandbox",
            "bwrap",
            "--home",
            str(tmp_path / "home"),
            "--ray-address",
            "127.0.0.1:1",
        ],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 2, result.output
    assert str(database) in result.output
    assert str(folder) in result.output
    assert "Traceback" not in result.output
    assert not database.exists()  # refused before anything was written there
