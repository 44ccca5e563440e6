"""Tables at 80 columns: columns are dropped by priority and words kept whole, never every
cell cut to "…" (issue 31, item 7)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import start, submit
from trainhub.cli.fit import fit_table
from trainhub.cli.main import app

SIM_COLUMNS = (
    "policy", "avg JCT h", "median JCT h", "p99 JCT h", "avg queue h", "p99 queue 1-GPU h",
    "makespan h", "util", "preemptions", "min share", "Jain", "wall s",
)  # fmt: skip


def _sim_table() -> Table:
    table = Table(title="pollux-1: 160 jobs on 64 x 8 GPU (512 GPUs)")
    for column in SIM_COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy in ("fair", "fifo", "sjf", "las"):
        table.add_row(policy, "0.96", "0.50", "12.34", "0.00", "3.21", "26.72", "0.169", "0",
                      "1.000", "1.000", "12.3")  # fmt: skip
    return table


def test_a_wide_table_drops_columns_by_priority_and_cuts_no_word() -> None:
    console = Console(width=80, record=True, force_terminal=False)
    table = _sim_table()
    dropped = fit_table(table, console, drop_first=("wall s", "median JCT h"))
    assert dropped[:2] == ["wall s", "median JCT h"]
    console.print(table)
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for word in ("policy", "makespan", "fair", "26.72", "0.169"):
        assert word in text
    # wide enough: nothing is dropped
    wide = Console(width=200, record=True, force_terminal=False)
    assert fit_table(_sim_table(), wide) == []


def _at_80(live: LiveServer, token: str, *args: str) -> str:
    env = {"TRAINHUB_URL": live.url, "TRAINHUB_TOKEN": token, "COLUMNS": "80"}
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_tables_are_readable_at_80_columns(cli: Cli, live: LiveServer) -> None:
    spec = (
        "name: a-rather-long-experiment-name\nentrypoint: python train.py\n"
        "hyperparameters: {lr: 0.01, batch_size: 64, epochs: 6, momentum: 0.9}\n"
    )
    for _ in range(2):
        submit(live, spec)
    start(live, submit(live, spec)["trial_ids"][0])
    token = live.api.admin_token
    for command in (["ls"], ["queue"], ["usage"], ["cluster"]):
        output = _at_80(live, token, *command)
        assert "…" not in output, (command, output)
        lines = output.splitlines()
        assert all(len(line) <= 80 for line in lines), (command, output)
    assert "a-rather-long-experiment-name" in _at_80(live, token, "ls")


def test_usage_says_slot_hours_of_cpu_shares_on_a_cluster_without_gpus(
    cli: Cli, live: LiveServer
) -> None:
    from tests.cli.test_scheduling import ran
    from trainhub.core.resources import Node

    now = time.time()
    ran(live, submit(live)["trial_ids"][0], now - 3600, now - 60, slots=2)
    gpu_title = cli("usage", "--days", "1").stdout
    assert "slot-hours (GPU-hours)" in gpu_title  # no node listed: as ever
    cpu_node = Node("cpu-a", total_gpus=0, total_cpus=16, free_gpus=0, free_cpus=16)
    live.api.services.cluster_nodes = lambda: [cpu_node]  # type: ignore[method-assign]
    said = cli("usage", "--days", "1").stdout
    assert "CPU-share hours: this cluster has no GPUs" in said
    assert "GPU-hours" not in said


def test_trainhub_sim_is_readable_at_80_columns(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:00:00,300,1,300,small\n"
        "2017-10-09 07:00:01,100,6,600,big\n"
        "2017-10-09 07:00:02,50,2,100,small\n"
    )
    args = ["sim", "--trace", str(trace), "-p", "fair", "-p", "fifo", "-p", "sjf", "-p", "las"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = result.stdout
    assert "…" not in table
    assert all(len(line) <= 80 for line in table.splitlines())
    for word in ("policy", "fair", "fifo", "sjf", "las", "avg", "queue", "util"):
        assert word in table
    assert "not shown at 80 columns: wall s" in result.stderr
