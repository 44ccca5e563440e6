"""Commands on the scheduler's side of things: the queue, trial priorities, usage accounting."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.markup import escape

from trainhub.cli.fit import print_fitted
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, err, fail, out

JSON = dict[str, Any]
DAY_S = 86_400.0


class Level(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"


def queue() -> None:
    """List the queued trials in the order the scheduler would start them.

    Each shows its position, experiment, tenant, owner, priority, how long it has waited since
    it was submitted, and why it is not running yet. When tenant guarantees add up to more
    than the cluster, a note says they are scaled down.
    """
    from trainhub.cli.render import QueueView

    with connect() as client:
        page = client.queue()
        trials = page["data"]
        experiments: dict[int, JSON] = {}
        if trials:
            # queued trials belong to active experiments: one request names them all
            active = client.list_experiments("ACTIVE", limit=1000)
            experiments = {e["id"]: e for e in active["data"]}
    if page.get("note"):
        out.print(f"note: {escape(page['note'])}")
    if not trials:
        out.print("the queue is empty")
        return
    out.print(QueueView(trials, experiments), soft_wrap=False)


def priority(
    trial_id: Annotated[int, typer.Argument(metavar="TRIAL_ID")],
    level: Annotated[
        Level,
        typer.Argument(
            metavar="LEVEL",
            case_sensitive=False,
            help="low, normal, high, or urgent (cluster admins only).",
        ),
    ],
) -> None:
    """Change the priority of a queued or running trial.

    The scheduler orders the queue by it from its next pass; a higher priority can also make a
    running trial of another tenant be preempted (it checkpoints and resumes later).
    """
    with connect() as client:
        trial = client.set_priority(trial_id, level.value)
    where = f" (queue position {trial['queue_position']})" if trial.get("queue_position") else ""
    out.print(f"trial {trial_id}: priority {trial['priority']}, {trial['state']}{where}")


def _parse_time(value: str, option: str) -> float:
    """A date (``2024-05-01``: UTC midnight) or an ISO date-time (UTC unless it has an offset)."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise fail(
            f"{option} {value!r} is not a date",
            "use YYYY-MM-DD (UTC) or an ISO date-time such as 2024-05-01T12:00",
            code=EXIT_INVALID_INPUT,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def usage(
    since: Annotated[
        str | None,
        typer.Option(
            metavar="DATE",
            help="Start of the period: YYYY-MM-DD (UTC) or an ISO date-time; default: 7 days ago.",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(metavar="DATE", help="End of the period; default: now.")
    ] = None,
    days: Annotated[
        float | None,
        typer.Option("--days", "-d", min=0.001, help="The period is the last N days."),
    ] = None,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="Print the rows as CSV (from the API) instead.")
    ] = False,
) -> None:
    """Show slot-hours per day, tenant, user and project, tenant shares and storage.

    A slot is a GPU, or a CPU share on a cluster without GPUs. Slot-hours per day, tenant,
    user and project; tenant shares; storage against its quotas.

    The second table sets each tenant's average slots over the period against its guarantee,
    and the guarantee kept: the GPU-time it received over the GPU-time it was entitled to
    (its guarantee, or its demand when that was smaller, at each instant). The third shows the
    checkpoints each tenant keeps against its storage quotas.
    A trial holds its slots from being scheduled until its attempt ends. Members see their own
    tenants; cluster admins see all.
    """
    if since is not None and days is not None:
        raise fail("give --since or --days, not both", code=EXIT_INVALID_INPUT)
    until_ts = _parse_time(until, "--until") if until is not None else None
    since_ts: float | None = None
    if since is not None:
        since_ts = _parse_time(since, "--since")
    elif days is not None:
        since_ts = (until_ts if until_ts is not None else time.time()) - days * DAY_S
    if since_ts is not None and until_ts is not None and since_ts >= until_ts:
        raise fail("the period is empty: --since must be before --until", code=EXIT_INVALID_INPUT)
    with connect() as client:
        if as_csv:
            sys.stdout.write(client.usage_csv(since_ts, until_ts))
            return
        report = client.usage(since_ts, until_ts)
        nodes = client.cluster()
    gpus = nodes["total_gpus"] > 0 or not nodes["nodes"]  # no node listed: say GPU, as ever
    from trainhub.cli.render import tenant_shares_table, usage_rows_table, usage_title

    out.print(f"[bold]{escape(usage_title(report))}[/]")
    out.print()
    if report["data"]:
        print_fitted(usage_rows_table(report["data"], gpus), out)
    else:
        out.print("no slots were allocated in this period")
    if report["tenants"]:
        out.print()
        print_fitted(tenant_shares_table(report["tenants"]), out)
    if report.get("storage"):
        from trainhub.cli.render import storage_table

        out.print()
        print_fitted(storage_table(report["storage"]), out)
    if not report["data"] and not report["tenants"]:
        err.print("[dim]you are in no tenant whose usage you may see[/]")
