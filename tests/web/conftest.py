"""A control plane (SQLite, steering as the server wires it, no Ray) behind uvicorn, and
Debian's Chromium through Playwright. Browser tests skip with the reason when either is missing."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.api.conftest import build_bounded_api
from tests.fixtures.api import Api
from trainhub.core.metric_budget import PointCaps

CHROMIUM = os.environ.get("TRAINHUB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@dataclass
class Site:
    api: Api
    url: str
    screenshots: Path


def serve(api: Api) -> tuple[uvicorn.Server, threading.Thread, socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        api.client.app, log_level="warning", lifespan="off", ws="none", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn exited while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.01)
    return server, thread, sock, port


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("site")
    # the pages are drawn from tens of thousands of points a test posts at once: the per-minute
    # cap of a trial's reports (tests/api/test_metric_caps.py) is not what they test
    api = build_bounded_api(root, point_caps=PointCaps(per_minute=10**9))
    engine = api.services.uow.engine  # type: ignore[attr-defined]
    assert api.services.steering is not None  # wired as the server wires it
    server, thread, sock, port = serve(api)
    shots = Path(os.environ.get("TRAINHUB_SCREENSHOTS") or tmp_path_factory.mktemp("screens"))
    try:
        yield Site(api, f"http://127.0.0.1:{port}", shots)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        engine.dispose()


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
