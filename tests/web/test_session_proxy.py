"""The sessions' proxy in front of a real JupyterLab, in a real uvicorn and Chromium (no Ray).

The control plane is the API of the web tests (SQLite, no Ray); the session is submitted through
the REST API as a user would; its trial is then marked running as the control loop would, and
its server is ``python -m trainhub.runtime.session_server`` (the entrypoint a session's rank
runs) started here with the environment the loop gives it. The end-to-end path through Ray and
the sandbox is tests/e2e/test_sessions.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.api.conftest import build_bounded_api
from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api
from tests.web.conftest import CHROMIUM
from trainhub.adapters.db.session_store import SqlSessionLimitStore
from trainhub.adapters.session_proxy import JupyterProbe, SessionRelay
from trainhub.adapters.session_relay import RelayServer, new_secret
from trainhub.adapters.tensorboard_export import tensorboard_files
from trainhub.core.states import TrialState
from trainhub.runtime import protocol
from trainhub.service.auth import hash_token
from trainhub.service.ports import SessionEndpoint
from trainhub.service.records import TrialUpdate
from trainhub.service.sessions import SessionService
from trainhub.service.trial_writes import write_trial

pytestmark = [pytest.mark.slow]


class FolderEndpoints:
    """Where each attempt's server listens: ``folder/<attempt key>/session.sock``, as the
    executor finds it in the attempt's spool folder on the node."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def session_endpoint(self, attempt_key: str) -> SessionEndpoint | None:
        path = self.folder / attempt_key / protocol.SESSION_SOCKET_NAME
        return SessionEndpoint(str(path)) if path.is_socket() else None


class RelayedEndpoints(FolderEndpoints):
    """As if every session ran on another node: each attempt's socket is reached through a
    relay (adapters/session_relay.py) with a secret of its own, as rank 0's actor serves it."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.relays: dict[str, RelayServer] = {}

    def session_endpoint(self, attempt_key: str) -> SessionEndpoint | None:
        local = super().session_endpoint(attempt_key)
        if local is None:
            return None
        relay = self.relays.get(attempt_key)
        if relay is None:
            relay = RelayServer("127.0.0.1", local.socket, new_secret())
            self.relays[attempt_key] = relay
        return SessionEndpoint(local.socket, relay.address, relay.secret)

    def close(self) -> None:
        for relay in self.relays.values():
            relay.close()


@dataclass
class Rig:
    api: Api
    url: str
    service: SessionService
    alice: str
    carol: str  # another member of alice's tenant
    bob: str  # another tenant's member
    root: Path
    servers: list[subprocess.Popen[bytes]]

    def headers(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def start(self, token: str | None = None, **body: Any) -> dict[str, Any]:
        """Submit a session, run its server as its rank would, and wait until it answers."""
        r = httpx.post(
            f"{self.url}/api/v1/sessions",
            json={"kind": "notebook", **body},
            headers=self.headers(token or self.alice),
            timeout=30,
        )
        assert r.status_code == 201, r.text
        session = r.json()
        trial_id = int(session["trial_id"])
        key = f"t{trial_id}-a1"
        env, home = self.service.launch_env(int(session["id"]))
        assert home == f"tenant-default/user-{session['owner']}"
        spool = self.root / "spool" / key
        spool.mkdir(parents=True)
        home_dir = self.root / "homes" / home
        home_dir.mkdir(parents=True, exist_ok=True)
        with self.api.services.uow() as repo:
            token_row = repo.add_token(
                hash_token("trial-secret-" + key), "trial", key, time.time(), trial_id=trial_id
            )
            repo.add_attempt(trial_id, 1, key, ("node-a",), None, token_row.id, time.time(), 0)
            write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
            write_trial(
                repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=time.time())
            )
        # the rank runs in its unpacked code context (a tensorboard session's event files)
        workdir = home_dir
        with self.api.services.uow() as repo:
            context = repo.context_key(int(session["id"]))
        if context is not None:
            workdir = spool / "code"
            with tarfile.open(fileobj=io.BytesIO(self.api.store.get(context))) as archive:
                archive.extractall(workdir, filter="data")
        log = (spool / "server.log").open("wb")
        self.servers.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainhub.runtime.session_server"],
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")},
                    **env,
                    protocol.ENV_SPOOL_DIR: str(spool),
                    protocol.ENV_TOKEN: "trial-secret-" + key,
                    "HOME": str(home_dir),
                    "CUDA_VISIBLE_DEVICES": "",
                },
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 120
        page = self.url + session["url"]
        if session["kind"] == "tensorboard":
            page += "data/environment"
        while time.monotonic() < deadline:
            answer = httpx.get(page, headers=self.headers(self.alice), timeout=30)
            if answer.status_code == 200:
                return session
            time.sleep(0.3)
        raise AssertionError(f"never served: {(spool / 'server.log').read_text()[-2000:]}")


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", ws="websockets-sansio", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.01)
    return server, thread, port


@contextlib.contextmanager
def open_rig(root: Path, relayed: bool = False) -> Iterator[Rig]:
    """The API of the web tests with sessions wired as the server wires them (no Ray), under
    uvicorn with WebSockets; also benchmarks/sessions.py --without-ray. ``relayed``: every
    session is reached through a relay, as on another node (ADR 0041)."""
    api = build_bounded_api(root)
    endpoints = RelayedEndpoints(root / "spool") if relayed else FolderEndpoints(root / "spool")
    engine = api.services.uow.engine  # type: ignore[attr-defined]
    service = SessionService(
        api.services.uow,
        SqlSessionLimitStore(engine),
        api.services.experiments,
        api.services.clock,
        b"k" * 32,
        endpoints=endpoints,
        probe=JupyterProbe(),
        relay=SessionRelay(),
        tensorboard_files=lambda trials: tensorboard_files(api.services.uow, trials),
    )
    api.services.sessions = service
    alice = api.user("alice", "default")
    carol = api.user("carol", "default")
    bob = api.user("bob", "teamb")
    server, thread, port = _serve(api.client.app)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        yield Rig(api, f"http://127.0.0.1:{port}", service, alice, carol, bob, root, servers)
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.should_exit = True
        thread.join(10)
        engine.dispose()
        if isinstance(endpoints, RelayedEndpoints):
            endpoints.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with open_rig(tmp_path_factory.mktemp("sessions")) as built:
        yield built


def _ws_status(url: str, token: str | None) -> int:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with connect(url, additional_headers=headers, open_timeout=30):
            return 101
    except InvalidStatus as exc:
        return int(exc.response.status_code)


def test_only_the_owner_and_admins_pass_the_proxy_on_http_and_websocket(rig: Rig) -> None:
    session = rig.start()
    page = rig.url + session["url"]
    base = session["url"].removesuffix("lab")
    name = httpx.post(
        f"{rig.url}{base}api/terminals", headers=rig.headers(rig.alice), timeout=30
    ).json()["name"]
    ws = rig.url.replace("http", "ws", 1) + f"{base}terminals/websocket/{name}"
    trial_token = "trial-secret-" + f"t{session['trial_id']}-a1"
    expected = {None: 401, "wrong": 401, rig.bob: 404, rig.carol: 404, trial_token: 404}
    for token, status in expected.items():
        answer = httpx.get(page, headers=rig.headers(token), timeout=30)
        assert answer.status_code == status, (token, answer.text)
        assert _ws_status(ws, token) == status, token
    assert httpx.get(page, headers=rig.headers(rig.alice), timeout=30).status_code == 200
    assert _ws_status(ws, rig.alice) == 101
    assert httpx.get(page, headers=rig.headers(rig.api.admin_token), timeout=30).status_code == 200
    # the server never sees trainhub's credentials: a request without the secret is refused
    socket_path = rig.root / "spool" / f"t{session['trial_id']}-a1" / "session.sock"
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport) as direct:
        refused = direct.get(f"http://x{base}api/status", headers=rig.headers(rig.alice))
    assert refused.status_code == 403


def test_a_terminal_runs_a_command_through_the_proxy(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainhub.cli.interactive import run_terminal
    from trainhub.client import TrainhubClient

    session = rig.start()
    with TrainhubClient(rig.url, rig.alice) as client:
        # the CLI's terminal (trainhub shell -c) over the proxy's WebSocket
        code = run_terminal(client, session, "echo hello-$((6*7))")
    output = capsys.readouterr().out
    assert code == 0
    assert "hello-42" in output


def test_an_idle_session_is_culled_and_a_used_one_is_not(rig: Rig) -> None:
    idle = rig.start(idle_timeout_s=5)
    used = rig.start(idle_timeout_s=5)
    base = used["url"].removesuffix("lab")
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:  # requests through the proxy keep it in use
        httpx.get(f"{rig.url}{base}api/contents", headers=rig.headers(rig.alice), timeout=30)
        time.sleep(1)
    culled = rig.service.cull_idle()
    assert int(idle["id"]) in culled
    assert int(used["id"]) not in culled
    trial = rig.api.services.experiments.get_trial(_admin(rig), int(idle["trial_id"])).trial
    assert trial.cancel_requested
    assert "idle for" in (trial.stop_reason or "")


def _admin(rig: Rig) -> Any:
    return rig.api.services.authenticate(rig.api.admin_token)


def _wait_kernel_idle(rig: Rig, session: dict[str, Any]) -> None:
    """The notebook's kernel has started (asked through the proxy, as the browser asks)."""
    url = rig.url + session["url"].removesuffix("lab") + "api/kernels"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        kernels = httpx.get(url, headers=rig.headers(rig.alice), timeout=30).json()
        if any(k.get("execution_state") == "idle" for k in kernels):
            return
        time.sleep(0.5)
    raise AssertionError(f"no kernel of session {session['id']} became idle")


def test_the_notebook_runs_a_cell_in_chromium_through_the_proxy(rig: Rig) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    (rig.root / "homes" / "tenant-default" / "user-alice").mkdir(parents=True, exist_ok=True)
    session = rig.start()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(rig.url + session["url"])
            assert "/ui/login" not in page.url
            # without a login the proxy refuses it
            assert page.locator("body").inner_text().find("unauthenticated") >= 0
            page.goto(f"{rig.url}/ui/login")
            page.fill("input[name=token]", rig.alice)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r".*/ui/experiments$"))
            page.goto(f"{rig.url}/ui/sessions")
            assert page.locator(f"#session-{session['id']} a.open").count() == 1
            page.goto(rig.url + session["url"])
            page.locator(".jp-LauncherCard[data-category='Notebook']").first.click()
            editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
            _wait_kernel_idle(rig, session)  # a cell run before the kernel started runs nowhere
            editor.click()
            page.keyboard.insert_text(
                "import os; print('CUDA=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
            )
            page.keyboard.press("Shift+Enter")
            output = page.locator(".jp-OutputArea-output").first
            output.wait_for()
            assert "CUDA=''" in output.inner_text()
            page.keyboard.press("Control+s")
            saved = rig.root / "homes" / "tenant-default" / "user-alice" / "Untitled.ipynb"
            deadline = time.monotonic() + 60
            while not saved.exists():
                assert time.monotonic() < deadline, "the notebook was never saved in the home"
                time.sleep(0.3)
        finally:
            browser.close()


def test_tensorboard_shows_the_metrics_trainhub_holds(rig: Rig) -> None:
    experiment = submit(rig.api, rig.alice).json()
    trial_id = experiment["trials"][0]["id"]
    own = start_attempt(rig.api, trial_id)
    points = [{"step": s, "values": {"loss": 1.0 / (s + 1)}} for s in range(5)]
    r = rig.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=own
    )
    assert r.status_code in (200, 202), r.text
    # a stranger may not build a TensorBoard of alice's trial
    refused = httpx.post(
        f"{rig.url}/api/v1/sessions",
        json={"kind": "tensorboard", "trials": [trial_id]},
        headers=rig.headers(rig.bob),
        timeout=30,
    )
    assert refused.status_code == 404, refused.text
    session = rig.start(kind="tensorboard", trials=[trial_id])
    assert session["url"].endswith("/server/")
    base = rig.url + session["url"]
    tags = httpx.get(f"{base}data/plugin/scalars/tags", headers=rig.headers(rig.alice), timeout=30)
    assert tags.json() == {
        f"trial-{trial_id}": {"loss": {"displayName": "loss", "description": ""}}
    }
    scalars = httpx.get(
        f"{base}data/plugin/scalars/scalars",
        params={"run": f"trial-{trial_id}", "tag": "loss"},
        headers=rig.headers(rig.alice),
        timeout=30,
    ).json()
    assert [round(v, 3) for _, step, v in scalars] == [1.0, 0.5, 0.333, 0.25, 0.2]
    assert httpx.get(base, headers=rig.headers(rig.bob), timeout=30).status_code == 404
