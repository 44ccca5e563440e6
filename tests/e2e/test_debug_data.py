"""End to end: a trial tracks its samples on a local Ray; `trainhub debug` lists the samples
whose labels it flipped at the top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fixtures.control_plane import ControlPlaneProcess
from trainhub import data
from trainhub.cli.main import app

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKLOAD = Path(__file__).parent / "debug_workload"
SPEC = """
name: e2e-debug-data
entrypoint: python train.py
resources: {cpus_per_worker: 1}
hyperparameters: {epochs: 12, flips: 30}
"""


def test_debug_lists_the_flipped_samples_first(
    control_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    trial_id = control_plane.submit(SPEC, WORKLOAD)["trials"][0]["id"]
    control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", 120, "COMPLETED")
    flipped = set(data.load("digits").train.sample_ids[:30].tolist())
    env = {
        "TRAINHUB_URL": control_plane.url,
        "TRAINHUB_TOKEN": control_plane.token,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "COLUMNS": "200",
    }
    png = tmp_path / "top.png"
    result = CliRunner().invoke(
        app, ["debug", f"trial/{trial_id}", "--top", "30", "--json", "--png", str(png)], env=env
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.splitlines()[0])
    top = [s["id"] for s in report["suspicious"]]
    assert len(set(top) & flipped) >= 27, (top, sorted(flipped))
    assert report["num_samples"] == len(data.load("digits").train)
    assert png.read_bytes().startswith(b"\x89PNG")
    table = CliRunner().invoke(app, ["debug", f"trial/{trial_id}", "--top", "5"], env=env)
    assert table.exit_code == 0, table.output
    assert "Most suspicious samples" in table.output
    assert "most confused" in table.output
