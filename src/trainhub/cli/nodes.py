"""`trainhub nodes`: the cluster's hardware and health; admins cordon, drain and uncordon nodes."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from trainhub.cli.fit import print_fitted
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, fail, out

app = typer.Typer(
    help="Nodes: hardware, health and live use (`trainhub nodes`); admins cordon, drain, uncordon.",
    invoke_without_command=True,
    no_args_is_help=False,
)

NodeArg = Annotated[str, typer.Argument(help="Node id, a unique prefix of it, or its hostname")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; shown in `trainhub nodes`")]


def _state(node: dict[str, Any]) -> Text:
    if node["draining"]:
        return Text("draining", style="yellow")
    if node["cordoned"]:
        return Text("cordoned", style="yellow")
    if not node["healthy"]:
        return Text("unhealthy", style="bold red")
    return Text("ok", style="green")


def _gpus(node: dict[str, Any]) -> str:
    inventory = node["gpu_inventory"]
    if not inventory:
        return "-"
    first = inventory[0]
    lines = [
        f"{len(inventory)}x {first['model']} {first['memory_gb']} GB, driver {first['driver']}"
    ]
    for gpu in node["gpus"]:
        power = f" {gpu['power_w']:.0f} W" if gpu["power_w"] is not None else ""
        trials = f" trial {','.join(map(str, gpu['trial_ids']))}" if gpu["trial_ids"] else ""
        lines.append(
            f"  {gpu['index']}: {gpu['utilization_pct']:.0f}% {gpu['memory_used_gb']:.1f}/"
            f"{gpu['memory_total_gb']:.0f} GB {gpu['temperature_c']:.0f}°C{power}{trials}"
        )
    return "\n".join(lines)


@app.callback()
def nodes(ctx: typer.Context) -> None:
    """List every node: CPU model and cores, memory, GPUs (model, memory, driver, live use),
    NICs and link speeds, health and whether it takes new trials."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as client:
        page = client.nodes()
    if not page["data"]:
        out.print("no nodes reported yet (the agents report within a few seconds of start)")
        return
    table = Table(show_edge=False, show_lines=True)
    for column in ("node", "state", "CPU", "memory", "GPUs", "NICs", "seen"):
        table.add_column(column)
    now = time.time()
    for n in page["data"]:
        why = "; ".join(n["health_reasons"]) or n["control_reason"]
        state = _state(n)
        if why:
            state.append(f"\n{why}", style="dim")
        cpu = f"{n['cpu_model'] or '?'}\n{n['num_cores'] or '?'} cores"
        if n["cpu_pct"] is not None:
            cpu += f", {n['cpu_pct']:.0f}% busy"
        memory = f"{n['memory_gb'] or '?'} GB host"
        if n["memory_used_gb"] is not None:
            memory += f"\n{n['memory_used_gb']:.1f} GB used"
        if n.get("reservable_memory_gb") is not None:  # as `trainhub cluster` shows it
            memory += f"\n{n['reservable_memory_gb']:.1f} GB for trials"
        nics = "\n".join(
            f"{x['name']} {x['address']} {x['speed_mbps']} Mb/s".strip() for x in n["nics"]
        )
        seen = f"{now - n['last_seen']:.0f} s ago" if n["last_seen"] else "never"
        host = f"\n{n['hostname']}" if n["hostname"] else ""
        topology = [
            f"{k}={n.get('labels', {})[k]}" for k in ("block", "rack") if k in n.get("labels", {})
        ]
        if topology:
            host += "\n" + " ".join(topology)
        table.add_row(
            Text(n["node_id"][:12] + host), state, cpu, memory, _gpus(n), nics or "-", seen
        )
    print_fitted(table, out)
    usable = sum(1 for n in page["data"] if n["schedulable"])
    out.print(f"{usable}/{page['count']} nodes take new trials")


def _control(node: str, action: str, reason: str) -> None:
    with connect() as client:
        n = client.control_node(node, action, reason)
    out.print(Text(f"node {n['node_id'][:12]}: ", style="bold") + _state(n))


@app.command()
def cordon(node: NodeArg, reason: ReasonOpt = "") -> None:
    """Admins: no new trials on the node; its running trials go on."""
    _control(node, "cordon", reason)


@app.command()
def drain(node: NodeArg, reason: ReasonOpt = "") -> None:
    """Admins: cordon the node and preempt its trials by checkpoint; they resume elsewhere."""
    _control(node, "drain", reason)


@app.command()
def uncordon(node: NodeArg) -> None:
    """Admins: the node takes new trials again (ends a drain too)."""
    _control(node, "uncordon", "")


@app.command()
def label(
    node: NodeArg,
    labels: Annotated[
        list[str],
        typer.Argument(metavar="KEY=VALUE...", help="e.g. rack=r3 block=b1; rack= removes it"),
    ],
) -> None:
    """Admins: set the node's labels: its topology levels (rack, block) for specs'
    resources.topology, or any other. Stored; they win over the agent's configured labels."""
    from trainhub.core.topology import parse_labels

    try:
        changes = parse_labels(labels)
    except ValueError as exc:
        raise fail(str(exc), "give KEY=VALUE pairs, e.g. rack=r3 block=b1",
                   code=EXIT_INVALID_INPUT) from None  # fmt: skip
    with connect() as client:
        n = client.label_node(node, changes)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(n.get("labels", {}).items())) or "none"
    out.print(Text(f"node {n['node_id'][:12]}: ", style="bold") + Text(f"labels {shown}"))


@app.command()
def history(
    node: NodeArg,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many changes")] = 20,
) -> None:
    """The node's health changes, newest first."""
    with connect() as client:
        events = client.node_health(node, limit)
    if not events:
        out.print("no health change recorded yet")
        return
    table = Table(show_edge=False)
    for column in ("when (UTC)", "health", "why"):
        table.add_column(column)
    for event in events:
        when = datetime.fromtimestamp(event["at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        health = Text("healthy", "green") if event["healthy"] else Text("unhealthy", "bold red")
        table.add_row(when, health, Text(event["reason"]))
    print_fitted(table, out)
