"""How the CLI shows experiments, trials, metrics and timings: Rich tables and panels.

Everything here turns API JSON into renderables and prints nothing itself. User data (names,
messages, metric keys) goes into Text objects or is escaped, never parsed as Rich markup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from trainhub.cli.context import human_bytes
from trainhub.core.step_timing import split_metrics, step_timing

STATE_STYLES = {
    "QUEUED": "yellow",
    "SCHEDULED": "cyan",
    "RUNNING": "bold blue",
    "PREEMPTING": "magenta",
    "PAUSED": "yellow",
    "COMPLETED": "bold green",
    "FAILED": "bold red",
    "CANCELED": "dim",
    "PRUNED": "dim",
    "ACTIVE": "bold blue",
}
OUTCOME_STYLES = {"SUCCEEDED": "green", "FAILED": "red", "LOST": "red", "PREEMPTED": "magenta"}
RECENT_EVENTS = 10

JSON = Mapping[str, Any]


# -- small formats --


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def ago(ts: float | None, now: float | None = None) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``; '-' for None."""
    if ts is None:
        return "-"
    seconds = max(0.0, (now if now is not None else time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def local_time(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    """``45s``, ``3m 12s``, ``2h 05m``, ``1d 04h``."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def span(start: float | None, end: float | None, now: float | None = None) -> str:
    if start is None:
        return "-"
    return duration((end if end is not None else (now or time.time())) - start)


def fmt_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}" if abs(value) >= 1e-3 else f"{value:.3e}"
    return str(value)


def titled_table(title: str) -> Table:
    """A table whose title sits on its own line, never wrapped to a narrow table's width."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        min_width=len(title),
    )


# -- metrics --


def metrics_table(values: JSON, title: str = "latest metrics") -> Table:
    table = titled_table(title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in sorted(values):
        table.add_row(Text(key), fmt_value(values[key]))
    return table


def timing_table(profiling: JSON) -> Table | None:
    """ "Where the time goes": step phases as shares of the step, then comm/throughput numbers."""
    timing = step_timing(profiling)
    if timing is None:
        return None
    table = titled_table("where the time goes")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("", min_width=20)
    for phase in timing.phases:
        seconds = f" ({phase.ms:.1f} ms)" if phase.ms is not None else ""
        bar = ProgressBar(total=1.0, completed=phase.bar, width=20, complete_style="cyan")
        table.add_row(Text(phase.name), f"{phase.share * 100:.1f}%{seconds}", bar)
    for key, value in timing.others:
        if isinstance(value, int | float) and "bytes" in key:
            shown = human_bytes(value)
        elif key == "time/step_s" and isinstance(value, int | float):
            shown = f"{value * 1000:.1f} ms"
        else:
            shown = fmt_value(value)
        table.add_row(Text(key), shown, "")
    return table


def metric_points_table(points: Sequence[JSON], keys: list[str]) -> Table:
    table = Table(show_edge=False)
    table.add_column("step", justify="right")
    table.add_column("attempt", justify="right")
    for key in keys:
        table.add_column(Text(key), justify="right")
    for p in points:
        values = p["values"]
        table.add_row(
            str(p["step"]),
            str(p["attempt"]),
            *(fmt_value(values[k]) if k in values else "" for k in keys),
        )
    return table


def metric_keys(points: Iterable[JSON]) -> list[str]:
    seen: dict[str, None] = {}
    for p in points:
        for key in p["values"]:
            seen.setdefault(key, None)
    return sorted(seen)


# -- progress --


def progress_renderable(progress: JSON, width: int = 40) -> RenderableType | None:
    """A bar with ``current/total unit`` (or just a count when the total is unknown)."""
    if not progress or progress.get("current") is None:
        return None
    current = float(progress["current"])
    total = progress.get("total")
    unit = str(progress.get("unit") or "steps")
    if not total:
        return Text(f"progress: {fmt_value(current)} {unit}")
    total = float(total)
    bar = ProgressBar(
        total=total, completed=min(current, total), width=width, complete_style="green"
    )
    label = Text(f" {fmt_value(current)}/{fmt_value(total)} {unit} ({current / total:.0%})")
    grid = Table.grid(padding=0)
    grid.add_row(bar, label)
    return grid


# -- experiments --


def experiments_table(rows: list[JSON], now: float | None = None) -> Table:
    table = Table(show_edge=False)
    for name, justify in (
        ("exp", "right"),
        ("name", "left"),
        ("tenant", "left"),
        ("owner", "left"),
        ("state", "left"),
        ("trials", "right"),
        ("best", "right"),
        ("created", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for e in rows:
        best = e.get("best_value")
        table.add_row(
            str(e["id"]),
            Text(e["name"]),
            Text(e["tenant"]),
            Text(e["owner"]),
            state_text(e["state"]),
            str(len(e["trial_ids"])),
            "" if best is None else f"{best:.4g}",
            ago(e["created_at"], now),
        )
    return table


def _fields(pairs: list[tuple[str, RenderableType | str]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for key, value in pairs:
        grid.add_row(key, value if not isinstance(value, str) else Text(value))
    return grid


def trials_table(trials: list[JSON], metric: str | None = None) -> Table:
    table = titled_table("trials")
    table.add_column("trial", justify="right")
    table.add_column("state")
    table.add_column("attempts", justify="right")
    table.add_column("hyperparameters")
    table.add_column(Text(metric or "step"), justify="right")
    table.add_column("pending / message")
    for t in trials:
        key = metric or "step"
        value = t["latest_metrics"].get(key)
        note = t["pending_reason"] if t["state"] == "QUEUED" else t.get("message")
        table.add_row(
            str(t["id"]),
            state_text(t["state"]),
            str(t["num_attempts"]),
            Text(", ".join(f"{k}={fmt_value(v)}" for k, v in t["hparams"].items())),
            "" if value is None else fmt_value(value),
            Text(note or ""),
        )
    return table


def experiment_view(e: JSON, now: float | None = None) -> RenderableType:
    spec = e.get("spec") or {}
    resources = spec.get("resources") or {}
    pairs: list[tuple[str, RenderableType | str]] = [
        ("experiment", Text.assemble((f"exp {e['id']}", "bold"), " ", (e["name"], "bold"))),
        ("state", state_text(e["state"])),
        ("project", e["project"]),
        ("tenant / owner", f"{e['tenant']} / {e['owner']}"),
        ("created", f"{local_time(e['created_at'])} ({ago(e['created_at'], now)})"),
    ]
    if e.get("ended_at"):
        pairs.append(
            ("ended", f"{local_time(e['ended_at'])} (took {span(e['created_at'], e['ended_at'])})")
        )
    if spec.get("entrypoint"):
        pairs.append(("entrypoint", spec["entrypoint"]))
    if resources:
        pairs.append(
            (
                "resources",
                f"{resources.get('workers', 1)} workers x "
                f"{resources.get('gpus_per_worker', 0)} GPU, "
                f"{fmt_value(resources.get('cpus_per_worker', 1))} CPU, "
                + (
                    f"{fmt_value(resources['memory_gb_per_worker'])} GB, "
                    if resources.get("memory_gb_per_worker")
                    else ""
                )
                + f"placement {resources.get('placement', 'pack')}",
            )
        )
    for item in spec.get("data") or []:  # pinned at submit: TENANT/NAME and its version
        pairs.append(("data", f"{item['name']}:{item['version']} at {item['mount']}"))
    for warning in e.get("warnings") or []:
        pairs.append(("warning", Text(warning, style="yellow")))
    parts: list[RenderableType] = [_fields(pairs)]
    trials = e.get("trials") or []
    if len(trials) > 1:
        metric = (spec.get("searcher") or {}).get("metric")
        parts += [Text(""), trials_table(trials, metric)]
    return Group(*parts)


# -- trials --


def trial_status_line(t: JSON, now: float | None = None) -> Text:
    """``trial 7 (demo) RUNNING, attempt 1, running 2m 03s``: the one line a follower sees."""
    text = Text.assemble("trial ", (str(t["id"]), "bold"))
    if t.get("experiment_name"):
        text.append(f" ({t['experiment_name']})")
    text.append(" ")
    text.append_text(state_text(t["state"]))
    if t["num_attempts"]:
        text.append(f", attempt {t['num_attempts']}")
    if t["state"] in ("RUNNING", "PREEMPTING") and t.get("started_at"):
        text.append(f", running {span(t['started_at'], None, now)}")
    elif t["state"] == "QUEUED":
        text.append(f", queued {span(t['submitted_at'], None, now)}")
    elif t.get("ended_at") and t.get("started_at"):
        text.append(f", ran {span(t['started_at'], t['ended_at'])}")
    return text


def _placement(placement: list[str]) -> str:
    """``node-a x2, node-b x2`` for ranks 0..3 placed on two nodes."""
    counts: dict[str, int] = {}
    for node in placement:
        counts[node] = counts.get(node, 0) + 1
    return ", ".join(f"{node[:12]} x{n}" if n > 1 else node[:12] for node, n in counts.items())


def attempts_table(attempts: list[JSON], now: float | None = None) -> Table:
    table = titled_table("attempts")
    table.add_column("#", justify="right")
    table.add_column("nodes (by rank)")
    table.add_column("outcome")
    table.add_column("exit codes")
    table.add_column("started")
    table.add_column("ran", justify="right")
    table.add_column("detail")
    for a in attempts:
        outcome = a.get("outcome") or "running"
        codes = ",".join("-" if c is None else str(c) for c in a.get("exit_codes") or [])
        table.add_row(
            str(a["number"]),
            Text(_placement(a.get("placement") or [])),
            Text(outcome, style=OUTCOME_STYLES.get(outcome, "blue")),
            codes or "-",
            ago(a.get("started_at"), now),
            span(a.get("started_at"), a.get("ended_at"), now),
            Text(a.get("detail") or ""),
        )
    return table


def checkpoints_table(checkpoints: list[JSON]) -> Table:
    table = titled_table("checkpoints")
    table.add_column("id", justify="right")
    table.add_column("step", justify="right")
    table.add_column("attempt", justify="right")
    table.add_column("metrics")
    table.add_column("size", justify="right")
    table.add_column("saved")
    for c in checkpoints:
        metrics = ", ".join(f"{k}={fmt_value(v)}" for k, v in sorted(c["metrics"].items()))
        table.add_row(
            str(c["id"]),
            str(c["step"]),
            str(c["attempt"]),
            Text(metrics),
            human_bytes(c["size_bytes"]),
            local_time(c["created_at"]),
        )
    return table


def events_table(events: list[JSON]) -> Table:
    table = titled_table("recent events")
    table.add_column("time")
    table.add_column("event")
    table.add_column("message")
    for ev in events[-RECENT_EVENTS:]:
        table.add_row(local_time(ev["time"]), Text(ev["kind"]), Text(ev["message"]))
    return table


def trial_view(t: JSON, now: float | None = None) -> RenderableType:
    """Everything ``trainhub show --trial`` shows about one trial."""
    pairs: list[tuple[str, RenderableType | str]] = [
        ("trial", trial_status_line(t, now)),
        ("experiment", f"exp {t['experiment_id']} ({t.get('experiment_name', '')})"),
        ("tenant", t["tenant"]),
        ("priority", t["priority"]),
        ("submitted", f"{local_time(t['submitted_at'])} ({ago(t['submitted_at'], now)})"),
    ]
    if t.get("started_at"):
        pairs.append(("started", local_time(t["started_at"])))
    if t.get("ended_at"):
        pairs.append(("ended", local_time(t["ended_at"])))
    if t["num_restarts"]:
        pairs.append(("restarts", str(t["num_restarts"])))
    if t["hparams"]:
        pairs.append(
            ("hyperparameters", ", ".join(f"{k}={fmt_value(v)}" for k, v in t["hparams"].items()))
        )
    if t["state"] == "QUEUED" and t.get("pending_reason"):
        pairs.append(("pending", Text(t["pending_reason"], style="yellow")))
    if t.get("message"):
        style = "red" if t["state"] == "FAILED" else ""
        pairs.append(("message", Text(t["message"], style=style)))
    if t.get("stop_requested"):
        pairs.append(("stop requested", t["stop_requested"]))
    for warning in t.get("warnings") or []:
        pairs.append(("warning", Text(warning, style="yellow")))
    if t.get("writes"):
        pairs.append(("writes", writes_text(t["writes"])))
    progress = progress_renderable(t.get("progress") or {})
    if progress is not None:
        pairs.append(("progress", progress))
    if t.get("limits"):
        pairs.append(("limits (per rank)", "\n".join(f"{k}: {v}" for k, v in t["limits"].items())))
    parts: list[RenderableType] = [_fields(pairs)]
    from trainhub.cli.layer_health import alerts_table, layer_table, split_layer_metrics

    latest, layer_metrics = split_layer_metrics(t.get("latest_metrics") or {})
    plain, profiling = split_metrics(latest)
    step = (t.get("latest_metrics") or {}).get("step")
    if plain:
        title = "latest metrics" + (f" (step {step})" if step is not None else "")
        parts += [Text(""), metrics_table(plain, title)]
    timing = timing_table(profiling)
    if timing is not None:
        parts += [Text(""), timing]
    layers = layer_table(layer_metrics)
    if layers is not None:
        parts += [Text(""), layers]
    if t.get("alerts"):
        parts += [Text(""), alerts_table(t["alerts"])]
    if t.get("attempts"):
        parts += [Text(""), attempts_table(t["attempts"], now)]
    from trainhub.cli.startup import startup_table

    startup = startup_table(t.get("events") or [])
    if startup is not None:
        parts += [Text(""), startup]
    if t.get("checkpoints"):
        parts += [Text(""), checkpoints_table(t["checkpoints"])]
    if t.get("events"):
        parts += [Text(""), events_table(t["events"])]
    return Group(*parts)


def writes_text(w: JSON) -> Text:
    """What a trial wrote against its caps: metric points and its folders on its nodes."""
    text = Text(
        f"{w['metric_points']:,} metric points of {w['max_metric_points_per_trial']:,} "
        f"(at most {w['max_metric_points_per_minute']:,} a minute)"
    )
    if w["metric_points_dropped"]:
        text.append(f", {w['metric_points_dropped']:,} dropped past the cap", style="red")
    if w["metric_requests_throttled"]:
        text.append(f", {w['metric_requests_throttled']:,} requests throttled", style="yellow")
    text.append(f"; {gigabytes(w['disk_bytes'])} in its folders on its nodes")
    return text


def next_steps(lines: list[tuple[str, str]]) -> Text:
    """A dim block of ``command  what it does`` lines."""
    width = max(len(cmd) for cmd, _ in lines)
    text = Text()
    for cmd, what in lines:
        text.append(f"  {cmd.ljust(width)}", style="cyan")
        text.append(f"  {what}\n", style="dim")
    return text


# -- the queue and usage --

PRIORITY_STYLES = {"low": "dim", "high": "bold", "urgent": "bold red"}


def _queue_cells(t: JSON, experiments: Mapping[int, JSON], now: float | None) -> list[Any]:
    """One queued trial's cells: position, trial, experiment, tenant, owner, priority, waiting,
    pending reason."""
    experiment = experiments.get(t["experiment_id"]) or {}
    name = experiment.get("name")
    position = t.get("queue_position")
    if t["state"] == "PAUSED":
        reason = Text("paused", style=STATE_STYLES["PAUSED"])
    else:
        reason = Text(t.get("pending_reason") or "waiting for the scheduler's next pass")
    return [
        "-" if position is None else str(position),
        str(t["id"]),
        Text(f"exp {t['experiment_id']} {name}" if name else f"exp {t['experiment_id']}"),
        Text(t["tenant"]),
        Text(experiment.get("owner") or "-"),
        Text(t["priority"], style=PRIORITY_STYLES.get(t["priority"], "")),
        span(t["submitted_at"], None, now),
        reason,
    ]


def queue_table(
    trials: Sequence[JSON], experiments: Mapping[int, JSON], now: float | None = None
) -> Table:
    """Queued trials in scheduling order: position, trial, experiment, tenant, priority, how
    long it has waited since it was submitted, and why it is not running."""
    table = Table(show_edge=False)
    for column, justify in (
        ("#", "right"),
        ("trial", "right"),
        ("experiment", "left"),
        ("tenant", "left"),
        ("owner", "left"),
        ("priority", "left"),
        ("waiting", "right"),
        ("pending reason", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for t in trials:
        table.add_row(*_queue_cells(t, experiments, now))
    return table


class QueueView:
    """The queue as :func:`queue_table` where the terminal is wide enough for its reasons; on a
    narrower one, each trial as one line of its facts with its pending reason below it, at the
    full width (the reason is what one reads the queue for, and a table squeezes it into a
    column a dozen characters wide)."""

    WIDE = 120

    def __init__(
        self, trials: Sequence[JSON], experiments: Mapping[int, JSON], now: float | None = None
    ) -> None:
        self.trials = trials
        self.experiments = experiments
        self.now = now

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= self.WIDE:
            yield queue_table(self.trials, self.experiments, self.now)
            return
        for t in self.trials:
            position, trial, experiment, tenant, owner, priority, waiting, reason = _queue_cells(
                t, self.experiments, self.now
            )
            yield Text.assemble(
                (f"{position:>3} ", "bold"),
                f"trial {trial}  ",
                experiment,
                "  ",
                tenant,
                "/",
                owner,
                "  ",
                priority,
                f"  waiting {waiting}",
            )
            yield Padding(reason, (0, 0, 0, 6))


def slot_hours(value: float) -> str:
    """``12.50``; ``<0.01`` for a little more than nothing."""
    if 0 < value < 0.005:
        return "<0.01"
    return f"{value:,.2f}"


def utc_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def usage_title(report: JSON) -> str:
    since, until = report["since"], report["until"]
    return f"usage {utc_time(since)} to {utc_time(until)} UTC ({duration(until - since)})"


def usage_rows_table(rows: Sequence[JSON], gpus: bool = True) -> Table:
    """Allocated slot-hours per UTC day, tenant, user and project, with a total; a slot is a
    GPU, or a CPU share on a cluster without GPUs (``gpus=False``)."""
    slot = "GPU-hours" if gpus else "CPU-share hours: this cluster has no GPUs"
    table = titled_table(f"slot-hours ({slot}) per day, tenant, user, project")
    table.add_column("day")
    table.add_column("tenant")
    table.add_column("user")
    table.add_column("project")
    table.add_column("slot-hours", justify="right")
    keys = ("inter_node_sent_bytes", "inter_node_received_bytes", "intra_node_bytes")
    network = any(r.get(k) for r in rows for k in keys)
    if network:  # bytes over the network (issue 30): only when some trial measured any
        table.add_column("sent to nodes", justify="right")
        table.add_column("received", justify="right")
        table.add_column("within a node", justify="right")
    for r in rows:
        cells = [r["day"], Text(r["tenant"]), Text(r["user"]), Text(r["project"])]
        cells.append(slot_hours(r["slot_hours"]))
        if network:
            cells += [human_bytes(int(r.get(k) or 0)) for k in keys]
        table.add_row(*cells)
    if len(rows) > 1:
        table.add_section()
        total = sum(float(r["slot_hours"]) for r in rows)
        extra = (
            [human_bytes(sum(int(r.get(k) or 0) for r in rows)) for k in keys] if network else []
        )
        table.add_row("total", "", "", "", slot_hours(total), *extra, style="bold")
    return table


def tenant_shares_table(tenants: Sequence[JSON]) -> Table:
    """Each tenant's allocation over the period against its guarantee."""
    table = titled_table("per tenant")
    table.add_column("tenant")
    table.add_column("guarantee (slots)", justify="right")
    table.add_column("slot-hours", justify="right")
    table.add_column("average slots", justify="right")
    table.add_column("share of guarantee", justify="right")
    table.add_column("guarantee kept", justify="right")
    for t in tenants:
        share = t.get("share_of_guarantee")
        kept = t.get("guarantee_kept")
        table.add_row(
            Text(t["tenant"]),
            str(t["guaranteed_slots"]),
            slot_hours(t["slot_hours"]),
            f"{t['average_slots']:.2f}",
            "-" if share is None else f"{share * 100:.1f}%",
            "-" if kept is None else f"{kept * 100:.1f}%",
        )
    return table


def gigabytes(size: int) -> str:
    """``1.25 GB``, ``1.1 TB``, ``340 MB`` (decimal units, as the quota options take them)."""
    return human_bytes(size)


def storage_table(rows: Sequence[JSON]) -> Table:
    """Each tenant's kept checkpoints against its storage quotas."""
    table = titled_table("storage (checkpoints kept now) and quotas")
    table.add_column("tenant")
    table.add_column("stored", justify="right")
    table.add_column("tenant quota", justify="right")
    table.add_column("used", justify="right")
    table.add_column("per trial", justify="right")
    table.add_column("per checkpoint", justify="right")
    for r in rows:
        used = r["checkpoint_bytes"] / r["max_storage_bytes"] if r["max_storage_bytes"] else 0.0
        table.add_row(
            Text(r["tenant"]),
            gigabytes(r["checkpoint_bytes"]),
            gigabytes(r["max_storage_bytes"]),
            f"{used * 100:.1f}%",
            gigabytes(r["max_trial_storage_bytes"]),
            gigabytes(r["max_checkpoint_bytes"]),
        )
    return table
