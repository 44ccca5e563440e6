"""Interactive sessions end to end (issue 26): a real control plane process, the session's Ray
head, the bubblewrap sandbox, JupyterLab and Debian's Chromium, everything through the control
plane's proxy.

A notebook started from the dashboard runs a cell that prints its CUDA_VISIBLE_DEVICES and lists
its dataset mount, saves the notebook in the owner's home, is stopped, and the next session finds
the file; ``trainhub shell -c`` runs a command; no token, another tenant, another member and a
trial's token are refused on HTTP and WebSocket; an idle session is culled; sessions count in
the usage report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.fixtures.control_plane import ControlPlaneProcess
from tests.web.conftest import CHROMIUM
from trainhub.adapters.sandbox import bwrap_problem
from trainhub.client import TrainhubClient
from trainhub.client.datasets import push_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

SERVE_TIMEOUT_S = 240.0  # JupyterLab's first start under a loaded machine


@dataclass
class World:
    plane: ControlPlaneProcess
    alice: str  # member of tenant default: owns the sessions
    carol: str  # another member of default
    bob: str  # member of tenant teamb
    tmp: Path

    def client(self, token: str | None = None) -> TrainhubClient:
        return TrainhubClient(self.plane.url, token or self.alice, timeout_s=60)

    def wait_serving(self, session_id: int, token: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        with self.client(token) as client:
            while time.monotonic() < deadline:
                session = client.session(session_id)
                assert session["state"] not in ("FAILED", "CANCELED", "COMPLETED"), (
                    session,
                    self.plane.log(session["trial_id"], 0) if session["trial_id"] else "",
                )
                if session["state"] == "RUNNING":
                    answer = client.session_request("GET", session["url"])
                    if answer.status_code == 200:
                        return session
                time.sleep(0.5)
        raise AssertionError(f"session {session_id} never served: {session}")

    def wait_ended(self, session_id: int, timeout_s: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while time.monotonic() < deadline:
                session = client.session(session_id)
                if session["state"] in ("FAILED", "CANCELED", "COMPLETED"):
                    return session
                time.sleep(0.5)
        raise AssertionError(f"session {session_id} did not end: {session}")


@pytest.fixture(scope="module")
def world(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    tmp = tmp_path_factory.mktemp("sessions")
    home = tmp / "home"
    home.mkdir()
    plane = ControlPlaneProcess(home, ray_address, settings={"sandbox": "bwrap"})
    plane.start()
    try:
        with TrainhubClient(plane.url, plane.token) as admin:
            admin.create_tenant("teamb")
            tokens = {}
            for user, tenant in (("alice", "default"), ("carol", "default"), ("bob", "teamb")):
                admin.create_user(user)
                admin.set_membership(user, tenant, "member")
                tokens[user] = admin.create_token(user, username=user)["token"]
            data = tmp / "greetings"
            data.mkdir()
            (data / "hello.txt").write_text("hello\n")
            push_dataset(admin, "greetings", data)
        yield World(plane, tokens["alice"], tokens["carol"], tokens["bob"], tmp)
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (make setup installs Debian's chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def _login(browser: Any, w: World) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(f"{w.plane.url}/ui/")
    page.fill("input[name=token]", w.alice)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/ui/experiments$"))
    return page


def _wait_kernel_idle(w: World, session: dict[str, Any]) -> None:
    """The notebook's kernel has started in the sandbox (a cell typed before runs nowhere)."""
    base = session["url"].removesuffix("lab")
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    with w.client() as client:
        while time.monotonic() < deadline:
            kernels = client.session_request("GET", f"{base}api/kernels").json()
            if any(k.get("execution_state") == "idle" for k in kernels):
                return
            time.sleep(0.5)
    raise AssertionError(f"no kernel of session {session['id']} became idle")


def _newest_session(w: World) -> dict[str, Any]:
    with w.client() as client:
        page = client.sessions()
    return max(page["data"], key=lambda s: int(s["id"]))


def test_a_notebook_runs_a_cell_on_its_gpus_and_data_and_keeps_its_files(
    world: World, browser: Any
) -> None:
    w = world
    page = _login(browser, w)
    # the dashboard's sessions page starts it
    page.goto(f"{w.plane.url}/ui/sessions")
    page.fill("input[name=data]", "greetings:/data/greet")
    page.fill("input[name=idle_timeout]", "20m")
    page.click("#start-notebook")
    page.wait_for_url(re.compile(r".*/ui/sessions#session-\d+$"))
    session = w.wait_serving(int(_newest_session(w)["id"]))
    page.reload()
    assert page.locator(f"#session-{session['id']} a.open").count() == 1

    page.goto(w.plane.url + session["url"])
    page.locator(".jp-LauncherCard[data-category='Notebook']").first.click()
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    _wait_kernel_idle(w, session)
    editor.click()
    page.keyboard.insert_text(
        "import os; print('CUDA=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES'))); "
        "print('DATA=' + ','.join(sorted(os.listdir('/data/greet'))))"
    )
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-OutputArea-output").first
    output.wait_for()
    text = output.inner_text()
    assert "DATA=hello.txt" in text, text
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert re.search(r"CUDA='?(\d+(,\d+)*)?'?", text), text  # CPU sessions see no GPU
    if visible is None:
        assert "CUDA=''" in text or "CUDA=None" in text, text
    page.keyboard.press("Control+s")
    base = session["url"].removesuffix("lab")
    deadline = time.monotonic() + 120
    notebook = f"{base}api/contents/Untitled.ipynb"
    saved: dict[str, Any] = {}
    with w.client() as client:  # the launcher made it empty; the save writes the cell
        while "DATA=hello.txt" not in str(saved.get("content")):
            assert time.monotonic() < deadline, f"the notebook was never saved: {saved}"
            page.keyboard.press("Escape")  # command mode: Ctrl+S saves from there too
            page.keyboard.press("Control+s")
            time.sleep(2)
            answer = client.session_request("GET", notebook)
            saved = answer.json() if answer.status_code == 200 else {}
    assert "DATA=hello.txt" in str(saved["content"])

    # stopped from its page; the next session finds the file in the same home
    page.goto(f"{w.plane.url}/ui/sessions")
    page.locator(f"#session-{session['id']} button.stop").click()
    assert w.wait_ended(int(session["id"]))["state"] == "CANCELED"
    with w.client() as client:
        again = client.start_session(kind="notebook")
    again = w.wait_serving(int(again["id"]))
    page.goto(w.plane.url + again["url"].removesuffix("lab") + "api/contents")
    assert "Untitled.ipynb" in page.content()
    page.close()
    with w.client() as client:
        client.stop_session(int(again["id"]))


def test_a_shell_runs_a_command_through_the_proxy(world: World) -> None:
    w = world
    env = {**os.environ, "TRAINHUB_URL": w.plane.url, "TRAINHUB_TOKEN": w.alice}
    done = subprocess.run(
        [sys.executable, "-m", "trainhub.cli.main", "shell", "-c", "echo hello-$((6*7)) $HOME"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=SERVE_TIMEOUT_S + 60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello-42 /trial/home" in done.stdout, done.stdout
    session = _newest_session_any(w)
    assert session["kind"] == "shell"
    assert w.wait_ended(int(session["id"]))["state"] == "CANCELED"  # ends with its terminal


def _newest_session_any(w: World) -> dict[str, Any]:
    with w.client() as client:
        page = client.sessions(include_ended=True)
    return max(page["data"], key=lambda s: int(s["id"]))


def _trial_token(trial_id: int, api_url: str) -> str:
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if (
            env.get("TRAINHUB_TRIAL_ID") == str(trial_id)
            and env.get("TRAINHUB_TOKEN")
            and env.get("TRAINHUB_API_URL", "").rstrip("/") == api_url  # not another server's
        ):
            return env["TRAINHUB_TOKEN"]
    raise AssertionError(f"no process of trial {trial_id}")


def _ws_status(url: str, token: str | None) -> int:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with connect(url, additional_headers=headers, open_timeout=30):
            return 101
    except InvalidStatus as exc:
        return int(exc.response.status_code)


def test_only_the_owner_and_admins_reach_a_session_on_http_and_websocket(world: World) -> None:
    w = world
    with w.client() as client:
        session = client.start_session(kind="shell", idle_timeout_s=600)
    session = w.wait_serving(int(session["id"]))
    page = w.plane.url + session["url"]
    base = session["url"].removesuffix("lab")
    trial = _trial_token(int(session["trial_id"]), w.plane.url)
    with w.client() as client:
        name = client.session_request("POST", f"{base}api/terminals").json()["name"]
    ws = w.plane.url.replace("http", "ws", 1) + f"{base}terminals/websocket/{name}"
    expected = {None: 401, w.bob: 404, w.carol: 404, trial: 404, w.alice: 200}
    for token, status in expected.items():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert httpx.get(page, headers=headers, timeout=60).status_code == status, token
        assert _ws_status(ws, token) == (101 if status == 200 else status), token
    # the tenant's admin (here: the cluster's) is let in; a wrong token is refused
    assert httpx.get(page, headers={"Authorization": f"Bearer {w.plane.token}"}).status_code == 200
    assert httpx.get(page, headers={"Authorization": "Bearer nope"}).status_code == 401
    with w.client() as client:
        client.stop_session(int(session["id"]))


def test_an_idle_session_is_culled_and_counted_in_usage(world: World) -> None:
    w = world
    with w.client() as client:
        session = client.start_session(kind="notebook", idle_timeout_s=5)
    session = w.wait_serving(int(session["id"]))
    served_at = time.monotonic()
    ended = w.wait_ended(int(session["id"]), timeout_s=5 + 30 + 30)
    assert ended["state"] == "CANCELED"
    assert "idle" in (ended["message"] or ""), ended
    assert time.monotonic() - served_at <= 5 + 30 + 15  # timeout + the 30 s + polling
    with w.client() as client:
        usage = client._json("GET", "/usage")
        trial = w.plane.trial(int(ended["trial_id"]))
    assert trial["ended_at"] is not None
    rows = [r for r in usage["data"] if r["project"] == "sessions" and r["user"] == "alice"]
    assert rows, usage["data"]
    assert rows[0]["slot_hours"] > 0, rows
