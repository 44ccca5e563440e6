"""``trainhub sim``: replay a job trace on a simulated cluster under scheduling policies.

Runs the same policy classes as the control plane (``trainhub.core.scheduling``) in the
discrete-event simulator and prints one row per policy, or JSON lines with ``--json``.

Examples::

    trainhub sim --trace philly --nodes 64 --gpus-per-node 8 --policy fair --policy fifo
    trainhub sim --trace tiresias-60 --policy las --json
    trainhub sim --trace philly --limit 5000 --policy fair --policy sjf --policy las
    trainhub sim --trace openb-default --nodes 48 --load 1.5 -p fair -p fifo --json
    trainhub sim --replay ~/.trainhub/trainhub.db --nodes 6 -p fair -p fifo --guarantee vision=8
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from trainhub.cli.fit import print_fitted
from trainhub.core.errors import TrainhubError
from trainhub.core.scheduling.factory import DEFAULT_POLICY, POLICY_NAMES, policy_help

# the choices of --policy, generated from the one list of policies
PolicyChoice = StrEnum("PolicyChoice", {name.upper(): name for name in POLICY_NAMES})  # type: ignore[misc]

app = typer.Typer(
    help="Replay a job trace on a simulated cluster under scheduling policies.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _hours(seconds: object) -> str:
    if not isinstance(seconds, int | float) or math.isnan(seconds):
        return "-"
    return f"{seconds / 3600:.2f}"


def _ratio(value: object) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:.3f}"


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no NaN (jq and browsers refuse it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@app.callback(invoke_without_command=True)
def sim(
    trace: Annotated[
        str,
        typer.Option(
            help="philly, pollux-1..8, openb-default, openb-gpushare100, tiresias-60, "
            "or a philly-format .csv"
        ),
    ] = "philly",
    policy: Annotated[
        list[PolicyChoice] | None,
        typer.Option(
            "--policy",
            "-p",
            case_sensitive=False,
            help=policy_help(default=None).removesuffix(".")
            + f"; repeat to compare (default: {DEFAULT_POLICY} and fifo)",
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(help="Nodes of the simulated cluster (default: the trace's, or 64)"),
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    limit: Annotated[int | None, typer.Option(help="Only the first N jobs")] = None,
    traces_dir: Annotated[
        Path | None, typer.Option(help="Folder of the traces (default: ../shared/traces)")
    ] = None,
    checkpoint_interval_s: Annotated[
        float, typer.Option(help="Productive time between periodic checkpoints of a job")
    ] = 1800.0,
    checkpoint_time_s: Annotated[
        float, typer.Option(help="Time a preempted job keeps its GPUs while it exits")
    ] = 30.0,
    restart_overhead_s: Annotated[float, typer.Option(help="Start-up time of a restart")] = 60.0,
    pass_interval_s: Annotated[
        float, typer.Option(help="Least time between scheduling passes (0: after every event)")
    ] = 0.0,
    known_durations: Annotated[
        bool, typer.Option(help="Show every policy the true durations (SJF always sees them)")
    ] = False,
    estimated_durations: Annotated[
        bool,
        typer.Option(
            help="Show the policies the server's estimate (median run time of finished jobs "
            "of the same tenant and size) as the expected duration"
        ),
    ] = False,
    load: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help="Run a window of the trace with its arrivals rescaled to offer this multiple "
            "of the cluster's capacity (0.7, 1.0, 1.5 in the benchmark); default: the trace "
            "at its own pace",
        ),
    ] = None,
    window_jobs_per_gpu: Annotated[
        int, typer.Option(min=1, help="With --load: jobs in the window per GPU of the cluster")
    ] = 8,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON line per policy with the benchmark's keys (ratios against FIFO "
            "and LAS, which run too if not asked for)",
        ),
    ] = False,
    replay: Annotated[
        str | None,
        typer.Option(
            help="Replay a server's database (SQLite path or URL, PostgreSQL URL) instead of "
            "a trace, next to what really happened",
        ),
    ] = None,
    guarantee: Annotated[
        list[str] | None,
        typer.Option(help="With --replay: TENANT=SLOTS, a guarantee to try; repeatable"),
    ] = None,
) -> None:
    """Simulate POLICY (default: fair and fifo) on TRACE and report completion times,
    queueing, utilisation, preemptions and fairness against each tenant's guarantee."""
    from trainhub.sim.cluster import ClusterSpec
    from trainhub.sim.engine import SimConfig
    from trainhub.sim.runner import compare, load_trace
    from trainhub.sim.sweep import cell_lines, cell_name, load_window

    console = Console()
    try:
        loaded = load_trace(trace, traces_dir, limit) if replay is None else None
        config = SimConfig(
            checkpoint_interval_s=checkpoint_interval_s,
            checkpoint_time_s=checkpoint_time_s,
            restart_overhead_s=restart_overhead_s,
            known_durations=known_durations,
            estimated_durations=estimated_durations,
            pass_interval_s=pass_interval_s,
        )
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if nodes is not None or loaded is None or loaded.cluster is None:
        cluster = ClusterSpec.uniform(nodes or 64, gpus_per_node)
    else:
        cluster = loaded.cluster
    names = [p.value for p in policy] if policy else [DEFAULT_POLICY, "fifo"]
    runs = list(names)
    if json_output:
        # FIFO is every ratio's baseline, LAS the average JCT's reference (issue 27); a
        # replay prints every run in full, so it adds FIFO only
        references = ("fifo",) if replay is not None else ("fifo", "las")
        runs += [p for p in references if p not in names]
    try:
        if replay is not None:
            from trainhub.cli.replay import replay_database
            from trainhub.sim.runner import Trace

            report = replay_database(replay, cluster, runs, guarantees=guarantee or (), sim=config)
            loaded = Trace("replay", report.history.jobs)
            results = report.results
        else:
            assert loaded is not None
            jobs = loaded.jobs
            if load is not None:
                size = window_jobs_per_gpu * cluster.total_gpus
                jobs = load_window(jobs, cluster.total_gpus, load, size)
            results = compare(jobs, cluster, runs, sim=config)
    except TrainhubError as exc:
        console.print(f"[red]error:[/red] {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        raise typer.Exit(2) from None
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    summaries = [r.summary() for r in results]
    if json_output:
        # a trace's own cluster may mix node sizes: it is named by its largest
        largest = max(n.num_gpus for n in cluster.nodes)
        cell = cell_name(loaded.name, len(cluster.nodes), largest, load)
        for summary, line in zip(summaries, cell_lines(cell, summaries), strict=True):
            if replay is not None:
                # a replay shows what really happened ("actual") beside each policy, in full
                typer.echo(json.dumps(_finite({**line, **summary}), allow_nan=False))
            elif line["policy"] in names:
                typer.echo(json.dumps(_finite(line), allow_nan=False))
        return
    table = Table(title=f"{loaded.name}: {len(loaded.jobs)} jobs on {cluster.describe()}")
    for column in (
        "policy",
        "avg JCT h",
        "median JCT h",
        "p99 JCT h",
        "avg queue h",
        "p99 queue 1-GPU h",
        "makespan h",
        "util",
        "preemptions",
        "min share",
        "Jain",
        "wall s",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for s in summaries:
        table.add_row(
            str(s["policy"]),
            _hours(s["avg_jct_s"]),
            _hours(s["median_jct_s"]),
            _hours(s["p99_jct_s"]),
            _hours(s["avg_queueing_s"]),
            _hours(s["p99_queueing_1gpu_s"]),
            _hours(s["makespan_s"]),
            _ratio(s["utilisation"]),
            str(s["preemptions"]),
            _ratio(s["fairness_min_ratio"]),
            _ratio(s["fairness_jain"]),
            f"{s['wall_s']:.1f}",
        )
    print_fitted(
        table,
        console,
        drop_first=("wall s", "median JCT h", "p99 queue 1-GPU h", "p99 JCT h", "preemptions"),
        hint="widen the terminal, or --json for every column",
    )
    console.print(
        "min share: the lowest tenant ratio of GPU-time received to min(guarantee, demand); "
        "guarantees are each tenant's share of the trace's GPU-time."
    )
