"""The dashboard's web terminal of a session (issue 26: "as a web terminal on the dashboard"),
in Debian's Chromium through Playwright: the sessions page links a running shell session to
its terminal page (xterm.js over the session server's terminal WebSocket, through the
control plane's proxy with the dashboard's cookie); a command typed there prints its output.
The rig is test_session_proxy.py's (a real JupyterLab server, no Ray)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.web.conftest import CHROMIUM
from tests.web.test_session_proxy import Rig, open_rig

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with open_rig(tmp_path_factory.mktemp("terminal")) as built:
        yield built


def test_a_command_typed_in_the_web_terminal_prints_its_output(rig: Rig) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    session = rig.start(kind="shell")
    terminal = f"{rig.url}/ui/sessions/{session['id']}/terminal"
    # another tenant's member gets no terminal page (as no proxied request)
    with httpx.Client(follow_redirects=False) as client:
        login = client.get(f"{rig.url}/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
        form = {"token": rig.bob, **({"csrf": csrf.group(1)} if csrf else {})}
        client.post(f"{rig.url}/ui/login", data=form)
        assert client.get(terminal).status_code == 404
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(f"{rig.url}/ui/login")
            page.fill("input[name=token]", rig.alice)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r".*/ui/experiments$"))
            page.goto(f"{rig.url}/ui/sessions")
            page.locator(f"#session-{session['id']} a.terminal").click()
            page.wait_for_url(terminal)
            page.locator("#terminal[data-state=open]").wait_for()
            page.locator("#terminal").click()
            page.keyboard.type("echo web-$((6*7))-$HOME\n")
            rows = page.locator("#terminal .xterm-rows")
            rows.filter(has_text="web-42-").wait_for()
            assert "web-42-" in rows.inner_text()
        finally:
            browser.close()
