"""The CLI's connection to the server and how it reports errors: a message, never a traceback.

Every command that talks to the server does so inside ``with connect() as client:``; an API
error becomes a readable message (with the per-field errors), an unreachable server says how
to start one, a 401 says how to log in.

Exit codes, the same for every command: 0 done; 2 the input was refused (a bad option or spec,
an unknown id, a 4xx answer of the server: fix the command and run it again); 1 a fault of the
server or the connection (a 5xx answer, unreachable: running it again later may work); 130
interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from trainhub.client import ApiError, Connection, TrainhubClient

EXIT_API_ERROR = 1  # a server fault (5xx) or no server answered
EXIT_INVALID_INPUT = 2  # the input was refused (bad option, 4xx answer)
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = (
    "Exit codes: 0 done; 2 the input was refused (bad option or spec, unknown id, any 4xx "
    "answer); 1 a server fault (5xx) or no server answered; 130 interrupted."
)


def exit_code_of(status_code: int) -> int:
    """The CLI's exit code for an HTTP error status: 2 for a refusal (4xx), 1 for a fault."""
    return EXIT_INVALID_INPUT if 400 <= status_code < 500 else EXIT_API_ERROR


# Console() looks up sys.stdout at each write, so these follow redirection (and CliRunner).
# emoji=False: user text such as the model reference 'a:b:c' must not become an emoji.
out = Console(highlight=False, soft_wrap=True, emoji=False)  # plain lines never break
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # commands to copy


def fail(message: str, hint: str = "", code: int = EXIT_API_ERROR) -> typer.Exit:
    """Print an error (and a hint) to stderr; return the Exit to raise."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")
    return typer.Exit(code)


def _as_option(path: str) -> str:
    """The running command's option for a request field the server refused (``weight`` ->
    ``--weight``, ``max_trials`` -> ``--max-trials``), else the field path as it is."""
    try:  # typer carries its own copy of click
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that no longer does: the field path is still right
        return path
    context = get_current_context(silent=True)
    if context is None or not path or "." in path:
        return path
    flag = "--" + path.replace("_", "-")
    for param in context.command.params:
        if param.param_type_name == "option" and flag in param.opts:
            return flag
    return path


def print_field_errors(errors: Sequence[Any]) -> None:
    """Print ``path: message (hint)`` for each field error, in red; a request field that is an
    option of the running command is named as that option.

    Accepts :class:`trainhub.core.errors.FieldError` objects and the API's JSON dicts alike.
    """
    for e in errors:
        path, message, hint = (
            (e.get("path", ""), e.get("message", ""), e.get("hint", ""))
            if isinstance(e, dict)
            else (e.path, e.message, e.hint)
        )
        path = _as_option(str(path))
        text = f"{path or '<root>'}: {message}" + (f" ({hint})" if hint else "")
        err.print(f"  [red]{escape(text)}[/]")


def _login_hint(connection: Connection) -> str:
    hint = (
        f"log in with `trainhub login --url {connection.url} --token TOKEN` "
        "or set TRAINHUB_TOKEN; an admin creates tokens with `trainhub tokens create`"
    )
    home = Path(os.environ.get("TRAINHUB_HOME", Path.home() / ".trainhub"))
    if (home / "admin-token").exists():
        hint += f" (a local server saved its first admin token in {home / 'admin-token'})"
    return hint


def report_api_error(exc: ApiError, connection: Connection) -> None:
    # the message of a 422 usually joins its field errors: then print each once, one a line
    joined = bool(exc.errors) and all(
        str(e.get("message", "") if isinstance(e, dict) else e.message) in exc.message
        for e in exc.errors
    )
    message = "the server refused these fields:" if joined else escape(exc.message)
    err.print(f"[bold red]error:[/] {message}")
    if exc.errors:
        print_field_errors(exc.errors)
    if exc.status_code == 401:
        if connection.token is None:
            err.print(f"[dim]hint:[/] no API token is set for {escape(connection.url)}")
        else:
            err.print(
                f"[dim]hint:[/] the token from {escape(connection.token_source or '?')} was refused"
            )
        err.print(f"[dim]hint:[/] {escape(_login_hint(connection))}")
    elif exc.hint:
        # the API's hint points at its JSON body's 'errors'; here they are the lines above
        hint = exc.hint.replace("the fields listed in 'errors'", "the fields above")
        err.print(f"[dim]hint:[/] {escape(hint)}")


@contextmanager
def connect(url: str | None = None, token: str | None = None) -> Iterator[TrainhubClient]:
    """A client for the configured server; API and connection errors exit with a message."""
    from trainhub.client import ApiError, ServerUnreachable, TrainhubClient, resolve_connection

    connection = resolve_connection(url, token)
    client = TrainhubClient(connection.url, connection.token)
    try:
        yield client
    except ApiError as exc:
        report_api_error(exc, connection)
        raise typer.Exit(exit_code_of(exc.status_code)) from None
    except ServerUnreachable as exc:
        if exc.timed_out:
            err.print(f"[bold red]trainhub at {escape(exc.url)} did not answer[/]")
            err.print("[dim]hint:[/] it may be overloaded; try again, or check its log")
        else:
            err.print(
                f"[bold red]cannot reach trainhub at {escape(exc.url)}[/]: start it with "
                "`trainhub server` or set TRAINHUB_URL"
            )
        err.print(f"[dim]({escape(exc.reason)})[/]")
        raise typer.Exit(EXIT_API_ERROR) from None
    finally:
        client.close()
