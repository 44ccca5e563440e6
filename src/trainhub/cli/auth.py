"""Logging in and out, and who the CLI talks to as whom."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape

from trainhub.cli.session import connect, err, out


def _describe(me: dict[str, object]) -> str:
    roles = me.get("roles") or {}
    assert isinstance(roles, dict)
    tenants = ", ".join(f"{t} ({r})" for t, r in sorted(roles.items())) or "none"
    admin = "cluster admin; " if me.get("is_admin") else ""
    return f"{me['username']} ({admin}tenants: {tenants})"


def login(
    url: Annotated[
        str | None,
        typer.Option(
            help="The server URL; default: TRAINHUB_URL, the saved one, or http://127.0.0.1:8080."
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="An API token; asked for (hidden) when left out."),
    ] = None,
) -> None:
    """Check a token against the server and save both for later commands (mode 0600)."""
    from trainhub.client import normalize_url, resolve_connection, save_credentials

    chosen_url = normalize_url(url) if url else resolve_connection().url
    if not token:
        token = typer.prompt("API token", hide_input=True)
    with connect(chosen_url, token) as client:
        me = client.me()
    path = save_credentials(chosen_url, token)
    out.print(f"logged in to {escape(chosen_url)} as {escape(_describe(me))}")
    out.print(f"[dim]saved to {escape(str(path))} (readable only by you)[/]")
    if os.environ.get("TRAINHUB_TOKEN"):
        err.print("[yellow]note: TRAINHUB_TOKEN is set and overrides the saved token[/]")
    if os.environ.get("TRAINHUB_URL") and normalize_url(os.environ["TRAINHUB_URL"]) != chosen_url:
        err.print("[yellow]note: TRAINHUB_URL is set and overrides the saved URL[/]")


def logout() -> None:
    """Forget the saved URL and token."""
    from trainhub.client import credentials_path

    path = credentials_path()
    if path.exists():
        path.unlink()
        out.print(f"removed {escape(str(path))}")
    else:
        out.print("not logged in")


def whoami() -> None:
    """Show the server, the user the token belongs to, and where both come from."""
    from trainhub.client import resolve_connection

    connection = resolve_connection()
    with connect() as client:
        me = client.me()
    out.print(escape(_describe(me)))
    out.print(
        f"[dim]server {escape(connection.url)} (from {escape(connection.url_source)}), "
        f"token from {escape(connection.token_source or '-')}[/]"
    )
