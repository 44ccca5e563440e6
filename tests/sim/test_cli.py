"""``trainhub sim`` on a small trace written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainhub.cli.sim import app
from trainhub.sim.sweep import LINE_KEYS

TRACE = (
    "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-09 07:00:00,600,8,4800,a\n"
    "2017-10-09 07:00:10,60,1,60,b\n"
    "2017-10-09 07:00:20,60,1,60,b\n"
    "2017-10-09 07:01:00,1200,4,4800,a\n"
)


def test_json_lines_per_policy_with_the_benchmark_keys(tmp_path: Path) -> None:
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    args = ["--trace", str(trace), "--nodes", "1", "--gpus-per-node", "8", "--json"]
    result = CliRunner().invoke(app, [*args, "-p", "fair", "-p", "sjf"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    # FIFO and LAS ran as the references, but only the policies asked for are printed
    assert [line["policy"] for line in lines] == ["fair", "sjf"]
    assert all(tuple(line) == LINE_KEYS for line in lines)
    assert lines[0]["cell"] == "small-1x8-full"
    assert lines[0]["split"] is None  # a user's own trace: in no split of the benchmark
    for key in (
        "avg_jct_vs_fifo",
        "fifo_wait_share",
        "avg_jct_vs_las",
        "las_avg_jct_vs_fifo",
        "p99_slowdown_vs_fifo",
        "tenant_weighted_jct_vs_fifo",
    ):
        assert isinstance(lines[0][key], float), key
    assert isinstance(lines[0]["fifo_queues"], bool)
    # the same LAS reference on every line of the run
    assert lines[0]["las_avg_jct_vs_fifo"] == lines[1]["las_avg_jct_vs_fifo"]


def test_table_and_errors(tmp_path: Path) -> None:
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    ok = CliRunner().invoke(app, ["--trace", str(trace), "--nodes", "2"])
    assert ok.exit_code == 0
    assert "fair" in ok.output
    assert "fifo" in ok.output
    bad = CliRunner().invoke(app, ["--trace", "nope"])
    assert bad.exit_code == 2
    assert "unknown trace" in bad.output
    policy = CliRunner().invoke(app, ["--trace", str(trace), "-p", "magic"])
    assert policy.exit_code == 2
    # the choices come from the policy registry; click names them all
    assert "'magic' is not one of" in policy.output
    assert "'las'" in policy.output


def test_estimated_durations_reach_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainhub.sim import runner

    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    seen: list[bool] = []
    real = runner.compare

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["sim"].estimated_durations)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "compare", recording)  # the real one, its input recorded
    args = ["--trace", str(trace), "--nodes", "1", "--gpus-per-node", "8", "--json", "-p", "fair"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert CliRunner().invoke(app, [*args, "--estimated-durations"]).exit_code == 0
    assert seen == [False, True]
