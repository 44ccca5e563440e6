"""`trainhub envs`: the cached trial environments; admins remove one (docs/environments.md)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from trainhub.cli.session import connect, out

app = typer.Typer(
    help="Trial environments: the cache of per-experiment packages (`trainhub envs`); "
    "admins remove one.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _size(num_bytes: int) -> str:
    if num_bytes >= 1 << 30:
        return f"{num_bytes / (1 << 30):.1f} GiB"
    if num_bytes >= 1 << 20:
        return f"{num_bytes / (1 << 20):.1f} MiB"
    return f"{num_bytes / 1024:.0f} KiB"


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    seconds = max(0.0, now - at)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def _packages(env: dict[str, Any]) -> str:
    shown = env["packages"] or env["requirements"]
    text = ", ".join(shown[:4])
    return text + (f" (+{len(shown) - 4})" if len(shown) > 4 else "")


@app.callback()
def envs(ctx: typer.Context) -> None:
    """List the cached environments: hash, packages, size, last use, builds and uses, nodes."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as client:
        page = client.environments()
    if not page["data"]:
        out.print(
            "no environments cached (an experiment asks for packages with "
            "environment.requirements or environment.packages)"
        )
        return
    table = Table(show_edge=False)
    for column in ("hash", "state", "packages", "size", "last use", "builds", "uses", "nodes"):
        table.add_column(column)
    now = time.time()
    for env in page["data"]:
        key = (env["key"] or env["request_key"])[:12]
        state = env["state"] if not env["error"] else f"{env['state']}: {env['error'][:60]}"
        nodes = ", ".join(n[:12] for n in env["nodes"]) or "-"
        table.add_row(
            key,
            state,
            _packages(env),
            _size(env["size_bytes"]),
            _ago(env["last_used_at"], now),
            str(env["num_builds"]),
            str(env["num_uses"]),
            nodes,
        )
    out.print(table)
    total = sum(e["size_bytes"] for e in page["data"])
    out.print(f"{page['count']} environments, {_size(total)}")


@app.command()
def rm(
    key: Annotated[str, typer.Argument(metavar="HASH", help="The hash `trainhub envs` shows.")],
) -> None:
    """Admins: remove a cached environment (refused while a queued or running trial needs it;
    the next trial that asks for it builds it again)."""
    with connect() as client:
        page = client.remove_environment(key)
    for env in page["data"]:
        out.print(f"removed environment {(env['key'] or env['request_key'])[:12]}")
