"""`trainhub debug` and `trainhub clone --drop-flagged/--relabel` against a served API."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import build_bounded_api
from tests.api.test_debugging import FLIPPED, NUM, tracked_trial
from tests.cli.conftest import Cli
from tests.fixtures.api import serve


@pytest.fixture
def served_cli(tmp_path: Path) -> Iterator[tuple[Cli, int, str]]:
    api = build_bounded_api(tmp_path)
    try:
        with api.client:
            trial_id, _, alice = tracked_trial(api)
            with serve(api.client.app) as port:
                token = alice["Authorization"].split()[1]
                yield Cli(f"http://127.0.0.1:{port}", token), trial_id, token
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_debug_prints_the_report_and_writes_csv_and_png(
    served_cli: tuple[Cli, int, str], tmp_path: Path
) -> None:
    cli, trial_id, _ = served_cli
    result = cli("debug", f"trial/{trial_id}", "--top", "5")
    assert result.exit_code == 0, result.output
    assert f"{NUM} samples over 6 epochs (digits); {len(FLIPPED)} flagged" in result.output
    for sample in FLIPPED:
        assert f"{sample}*" in result.output
    assert "most confused:" in result.output
    out_csv, out_png = tmp_path / "s.csv", tmp_path / "s.png"
    result = cli(
        "debug", f"trial/{trial_id}", "--json", "--csv", str(out_csv), "--png", str(out_png)
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[0])["num_flagged"] == len(FLIPPED)
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == NUM
    assert out_png.read_bytes().startswith(b"\x89PNG")
    missing = cli("debug", "trial/999999")
    assert missing.exit_code == 2  # an unknown id is a refusal of input
    assert "does not exist" in missing.output


def test_clone_without_flagged_samples_or_with_new_labels(
    served_cli: tuple[Cli, int, str], tmp_path: Path
) -> None:
    cli, trial_id, _ = served_cli
    result = cli("clone", str(trial_id), "--drop-flagged", "0.05")
    assert result.exit_code == 0, result.output
    assert f"a clone of trial {trial_id}" in result.output
    fixes = tmp_path / "fixes.csv"
    fixes.write_text("id,label\n3,0\n17,1\n")
    result = cli("clone", str(trial_id), "--relabel", str(fixes))
    assert result.exit_code == 0, result.output
    fixes.write_text("sample,label\n3,0\n")
    result = cli("clone", str(trial_id), "--relabel", str(fixes))
    assert result.exit_code == 2
    assert "needs columns 'id' and 'label'" in result.output


def test_debug_reads_a_standalone_runs_records_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tests.api.test_debugging import dynamics
    from trainhub.cli.main import app

    records = tmp_path / "trainhub-samples.jsonl"
    records.write_text("".join(json.dumps(dynamics(e, f"e{e}")) + "\n" for e in range(6)))
    out_png = tmp_path / "top.png"
    result = CliRunner().invoke(
        app, ["debug", str(records), "--top", "5", "--png", str(out_png)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert f"standalone run: {NUM} samples over 6 epochs" in result.output
    for sample in FLIPPED:
        assert f"{sample}*" in result.output
    assert out_png.read_bytes().startswith(b"\x89PNG")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    result = CliRunner().invoke(app, ["debug", str(bad)])
    assert result.exit_code == 2
    assert "not a sample records file" in result.output
