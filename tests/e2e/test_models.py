"""End to end: a trial's checkpoint registered as a model, compressed by `trainhub compress` as
a trial on the session's Ray (weights through init_from), registered as version 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fixtures.control_plane import ControlPlaneProcess
from trainhub.cli.main import app

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "models_workload"
ARCH = {"zoo": "mlp", "args": {"in_features": 64, "hidden": [32], "num_classes": 10}}
SPEC = {
    "name": "pretrain",
    "entrypoint": "python pretrain.py",
    "model": {"arch": {**ARCH, "input": [1, 8, 8]}},
}


def test_compress_runs_as_a_trial_and_registers_a_new_version(
    control_plane: ControlPlaneProcess,
) -> None:
    pytest.importorskip("onnxruntime")
    experiment = control_plane.submit(json.dumps(SPEC), WORKLOAD)
    trial_id = experiment["trials"][0]["id"]
    control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    r = control_plane.request("POST", "/models", json={"trial_id": trial_id, "name": "digits"})
    assert r.status_code == 201, r.text
    env = {"TRAINHUB_URL": control_plane.url, "TRAINHUB_TOKEN": control_plane.token}
    result = CliRunner().invoke(
        app,
        ["compress", "digits", "--prune", "0.5", "--finetune-epochs", "1", "--data", "digits"],
        env=env,
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output + control_plane.log_tail()
    assert "registered default/digits:2" in result.output
    version = control_plane.request("GET", "/models/digits/versions/2").json()
    assert version["lineage"]["compressed_from"] == "default/digits:1"
    metrics = version["metrics"]
    assert metrics["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert metrics["size_ratio"] > 2.5
    assert metrics["accuracy_loss_points"] < 5
