"""End to end: a trial watched with ctx.watch on the session's Ray; its NaN alert names the
layer in the API and in `trainhub show`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKLOAD = Path(__file__).parent / "layer_health_workload"
SPEC = """\
name: layer-health
entrypoint: python train.py
resources: {workers: 1, cpus_per_worker: 1}
hyperparameters: {steps: 30, every: 5, nan_at: 20}
"""


def test_a_watched_trial_reports_layer_series_and_names_the_nan_layer(
    control_plane: ControlPlaneProcess,
) -> None:
    from trainhub.cli.main import app

    trial_id = control_plane.submit(SPEC, WORKLOAD)["trials"][0]["id"]
    trial = control_plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=120, what="COMPLETED"
    )
    series = control_plane.metrics(trial_id)
    grad_steps = [p["step"] for p in series if "layers/0/grad_norm" in p["values"]]
    assert grad_steps == [0, 5, 10, 15]  # from step 20 on every value is NaN and not shipped
    nonfinite = [a for a in trial["alerts"] if a["kind"] == "nonfinite"]
    assert [(a["layer"], a["step"]) for a in nonfinite] == [("2", 20)]

    env = {"TRAINHUB_URL": control_plane.url, "TRAINHUB_TOKEN": control_plane.token}
    env["COLUMNS"] = "200"
    result = CliRunner().invoke(app, ["show", "--trial", str(trial_id)], env=env)
    assert result.exit_code == 0, result.output
    alerts = result.stdout[result.stdout.index("layer alerts") :]
    assert "nonfinite" in alerts
    assert "NaN/Inf first appeared in its output (forward pass) of layer 2 at step 20" in alerts
