"""`trainhub profile TRIAL --steps 20`: torch.profiler on every rank of a running trial; the
top operators by time per rank, and each rank's trace (opens in Perfetto)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trainhub.cli.ids import ID_HELP, TrialOpt, parse_ref, trial_of
from trainhub.cli.session import EXIT_API_ERROR, EXIT_INVALID_INPUT, connect, err, fail, out
from trainhub.core.limits import MAX_PROFILE_STEPS


def _table(rank: dict[str, Any], top: int) -> Table:
    table = Table(title=f"rank {rank['rank']}: top operators by self time", title_justify="left")
    for column in ("operator", "calls", "self CPU ms", "CPU total ms", "self GPU ms"):
        table.add_column(column, justify="left" if column == "operator" else "right")
    for op in rank["top_ops"][:top]:
        table.add_row(
            op["name"][:60],
            str(op["calls"]),
            f"{op.get('self_cpu_ms') or 0:.3f}",
            f"{op.get('cpu_total_ms') or 0:.3f}",
            f"{op.get('self_device_ms') or 0:.3f}",
        )
    return table


def profile(
    ref: Annotated[str, typer.Argument(metavar="ID", help=ID_HELP)],
    trial: TrialOpt = False,
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=MAX_PROFILE_STEPS, help="Steps to profile.")
    ] = 20,
    wait_s: Annotated[
        float, typer.Option("--wait", min=0, help="Seconds to wait for every rank.")
    ] = 600.0,
    top: Annotated[int, typer.Option("--top", min=1, help="Operators shown per rank.")] = 15,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="A directory to save each rank's trace (.json.gz) in."),
    ] = None,
) -> None:
    """Profile a running trial's next steps on every rank; show the top operators per rank.

    Runs torch.profiler in the trial's processes; its script calls `ctx.profile_step()` once
    per step."""
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise fail(f"--out {out_dir} is a file", "pass a directory", code=EXIT_INVALID_INPUT)
    with connect() as client:
        trial_id = trial_of(client, parse_ref(ref, trial), "profile")
        started = client.request_profile(trial_id, steps)
        profile_id = started["id"]
        err.print(f"profile {profile_id}: waiting for {started['world_size']} rank(s)...")
        deadline = time.monotonic() + wait_s
        current = started
        while current["state"] in ("REQUESTED", "RUNNING") and time.monotonic() < deadline:
            time.sleep(1.0)
            current = client.get_profile(trial_id, profile_id)
        for rank in current["ranks"]:
            out.print(_table(rank, top))
        if current["state"] != "DONE":
            reason = current["detail"] or f"still {current['state']} after {wait_s:.0f} s"
            err.print(f"[bold red]profile {profile_id} is not complete[/]: {reason}")
            if current["state"] == "REQUESTED":  # no rank has begun: no profile_step() calls?
                err.print(
                    "[dim]hint:[/] no rank has started it; the trial's script must call "
                    "ctx.profile_step() once per training step (docs/ui.md)"
                )
            err.print(f"[dim]hint:[/] see it later on the dashboard's page /ui/trials/{trial_id}")
            raise typer.Exit(EXIT_API_ERROR)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            for rank in current["ranks"]:
                data = client.profile_trace(trial_id, profile_id, rank["rank"])
                path = (
                    out_dir
                    / f"trial{trial_id}-profile{profile_id}-rank{rank['rank']}.trace.json.gz"
                )
                path.write_bytes(data)
                out.print(f"rank {rank['rank']}: {path} (open it in https://ui.perfetto.dev)")
        else:
            out.print(
                f"traces: trainhub profile ... --out DIR, or /ui/trials/{trial_id} "
                "(open them in https://ui.perfetto.dev)"
            )
