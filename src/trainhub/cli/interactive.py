"""`trainhub notebook`, `trainhub shell`, `trainhub tensorboard`, `trainhub sessions`:
interactive sessions on the cluster's GPUs, through the control plane's proxy
(docs/sessions.md)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trainhub.cli.ids import ID_HELP, TrialOpt, parse_ref
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, fail, out

if TYPE_CHECKING:
    from trainhub.client import TrainhubClient

app = typer.Typer(
    help="Interactive sessions: list them (`trainhub sessions`), stop one.",
    invoke_without_command=True,
    no_args_is_help=False,
)

GpusOpt = Annotated[int, typer.Option("--gpus", min=0, max=16, help="GPUs of the session.")]
EnvOpt = Annotated[
    Path | None,
    typer.Option(
        "--env", exists=True, dir_okay=False, help="A requirements file installed over the base."
    ),
]
DataOpt = Annotated[
    list[str] | None,
    typer.Option("--data", help="A dataset as NAME:/MOUNT (repeat for several)."),
]
IdleOpt = Annotated[
    str | None,
    typer.Option("--idle-timeout", help="End the session after this long idle: 30m, 2h, 90s."),
]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="The tenant it runs for.")]
WaitOpt = Annotated[
    float, typer.Option("--wait", min=0, help="Seconds to wait for it to serve (0: do not wait).")
]
FINAL = ("COMPLETED", "FAILED", "CANCELED", "PRUNED")


def _request(
    kind: str,
    gpus: int,
    env: Path | None,
    data: list[str] | None,
    idle_timeout: str | None,
    tenant: str | None,
    trials: list[int] | None = None,
) -> dict[str, Any]:
    from trainhub.core.session_spec import parse_duration

    body: dict[str, Any] = {"kind": kind, "gpus": gpus, "data": list(data or [])}
    if idle_timeout:
        try:
            body["idle_timeout_s"] = parse_duration(idle_timeout, "--idle-timeout")
        except ValueError as exc:
            raise fail(str(exc), "e.g. --idle-timeout 30m", code=EXIT_INVALID_INPUT) from None
    if env is not None:
        body["requirements"] = env.read_text()
    if tenant:
        body["tenant"] = tenant
    if trials:
        body["trials"] = trials
    return body


def wait_until_serving(
    client: TrainhubClient, session: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """Poll until the session's page answers through the proxy (or it ended, or time ran out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        session = client.session(int(session["id"]))
        if session["state"] in FINAL:
            raise fail(
                f"session {session['id']} ended: {session['state']} {session.get('message') or ''}",
                f"its log: trainhub logs trial/{session['trial_id']}",
            )
        if session["state"] == "RUNNING":
            answer = client.session_request("GET", session["url"], follow_redirects=True)
            if answer.status_code < 400:
                return session
        if time.monotonic() > deadline:
            return session
        time.sleep(0.2)


def _start(kind: str, body: dict[str, Any], wait: float) -> tuple[dict[str, Any], str]:
    with connect() as client:
        session = client.start_session(**body)
        out.print(f"session {session['id']} ({kind}) queued")
        if wait:
            session = wait_until_serving(client, session, wait)
        return session, client.url


def _show(session: dict[str, Any], url: str) -> None:
    link = url + session["url"]
    if session["state"] == "RUNNING":
        out.print(f"session {session['id']} serves at {link}")
        out.print("  (open it logged in to the dashboard; `trainhub sessions stop ID` ends it)")
    else:
        reason = f": {session['message']}" if session.get("message") else ""
        out.print(f"session {session['id']} is {session['state']}{reason}; it will serve at {link}")


def notebook(
    gpus: GpusOpt = 0,
    env: EnvOpt = None,
    data: DataOpt = None,
    idle_timeout: IdleOpt = None,
    tenant: TenantOpt = None,
    wait: WaitOpt = 600.0,
) -> None:
    """Start JupyterLab on the cluster (queued like a trial); print its address."""
    body = _request("notebook", gpus, env, data, idle_timeout, tenant)
    session, url = _start("notebook", body, wait)
    _show(session, url)


def tensorboard(
    ref: Annotated[str, typer.Argument(metavar="ID", help=ID_HELP)],
    trial: TrialOpt = False,
    idle_timeout: IdleOpt = None,
    tenant: TenantOpt = None,
    wait: WaitOpt = 600.0,
) -> None:
    """TensorBoard over the metrics of an experiment's trials, or of one trial."""
    target = parse_ref(ref, trial)
    with connect() as client:
        if target.kind == "trial":
            trials = [target.id]
        else:
            experiment = client.get_experiment(target.id)
            trials = [int(t["id"]) for t in experiment.get("trials") or []]
    if not trials:
        raise fail(f"{target} has no trial yet", "", code=EXIT_INVALID_INPUT)
    body = _request("tensorboard", 0, None, None, idle_timeout, tenant, trials)
    session, url = _start("tensorboard", body, wait)
    _show(session, url)


def shell(
    gpus: GpusOpt = 0,
    env: EnvOpt = None,
    data: DataOpt = None,
    idle_timeout: IdleOpt = None,
    tenant: TenantOpt = None,
    command: Annotated[
        str | None,
        typer.Option("--command", "-c", help="Run this command, print its output, end."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the session when the terminal closes.")
    ] = False,
    wait: WaitOpt = 600.0,
) -> None:
    """An interactive terminal on the cluster, in this terminal (a web terminal of the same
    session is on its page)."""
    body = _request("shell", gpus, env, data, idle_timeout, tenant)
    session, _ = _start("shell", body, wait or 600.0)
    if session["state"] != "RUNNING":
        _show(session, "")
        raise typer.Exit(1)
    try:
        with connect() as client:
            code = run_terminal(client, session, command)
    finally:
        if not keep:
            with connect() as client, contextlib.suppress(Exception):
                client.stop_session(int(session["id"]))
    raise typer.Exit(code)


def run_terminal(client: TrainhubClient, session: dict[str, Any], command: str | None) -> int:
    """A terminal of the session's server over the proxy's WebSocket (terminado's protocol)."""
    from websockets.sync.client import connect as ws_connect

    base = session["url"].removesuffix("lab")
    answer = client.session_request("POST", base + "api/terminals")
    if answer.status_code >= 400:
        raise fail(f"the session refused a terminal: {answer.status_code} {answer.text[:200]}")
    name = answer.json()["name"]
    ws_url = client.url.replace("http", "ws", 1) + f"{base}terminals/websocket/{name}"
    with ws_connect(ws_url, additional_headers=client.auth_headers, max_size=None) as ws:
        if command is not None:
            return _run_command(ws, command)
        return _interactive(ws)


def _run_command(ws: Any, command: str) -> int:
    marker = "__trainhub_done__"
    ws.send(json.dumps(["stdin", f"{command}; echo {marker}$?\r"]))
    seen = ""
    while True:
        message = json.loads(ws.recv(timeout=120))
        if message[0] == "stdout":
            seen += message[1]
            sys.stdout.write(message[1])
            sys.stdout.flush()
            tail = seen.rsplit(marker, 1)
            if len(tail) == 2 and tail[1][:1].isdigit():
                return int("".join(c for c in tail[1][:3] if c.isdigit()) or 0)
        elif message[0] == "disconnect":
            return 1


def _interactive(ws: Any) -> int:
    import select
    import termios
    import threading
    import tty

    stdin = sys.stdin.fileno()
    old = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    size = os.get_terminal_size() if old else os.terminal_size((80, 24))
    ws.send(json.dumps(["set_size", size.lines, size.columns]))
    closed = threading.Event()

    def reader() -> None:
        try:
            for raw in ws:
                message = json.loads(raw)
                if message[0] == "stdout":
                    sys.stdout.write(message[1])
                    sys.stdout.flush()
                elif message[0] == "disconnect":
                    break
        finally:
            closed.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        if old:
            tty.setraw(stdin)
        while not closed.is_set():
            ready, _, _ = select.select([stdin], [], [], 0.2)
            if ready:
                data = os.read(stdin, 4096)
                if not data:
                    break
                ws.send(json.dumps(["stdin", data.decode(errors="replace")]))
    finally:
        if old:
            termios.tcsetattr(stdin, termios.TCSADRAIN, old)
    return 0


def _age(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, now - at)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@app.callback()
def sessions(
    ctx: typer.Context,
    all: Annotated[bool, typer.Option("--all", help="The ended sessions too.")] = False,
) -> None:
    """List sessions: owner, GPUs, node, age, idle time, URL."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as client:
        page = client.sessions(include_ended=all)
        url = client.url
    if not page["data"]:
        out.print("no sessions (start one with trainhub notebook)")
        return
    table = Table(show_edge=False)
    for column in ("id", "kind", "owner", "GPUs", "state", "node", "age", "idle", "URL"):
        table.add_column(column)
    now = time.time()
    for s in page["data"]:
        idle = "-" if s["idle_s"] is None else _age(now - s["idle_s"], now)
        table.add_row(
            str(s["id"]),
            s["kind"],
            s["owner"],
            str(s["gpus"]),
            s["state"],
            (s["node"] or "-")[:12],
            _age(s["created_at"], now),
            idle,
            url + s["url"],
        )
    out.print(table)


@app.command("stop")
def stop(session_id: Annotated[int, typer.Argument(metavar="ID", min=1)]) -> None:
    """End a session and free its GPUs (its owner's home folder is kept)."""
    with connect() as client:
        session = client.stop_session(session_id)
    out.print(f"session {session['id']}: {session['state']}")
