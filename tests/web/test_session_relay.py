"""The proxy to a session on another node, through its node's relay (ADR 0041), without Ray:
the rig of test_session_proxy.py with every attempt's socket behind a
:class:`~trainhub.adapters.session_relay.RelayServer` (what rank 0's actor serves), so each
request and WebSocket of the proxy, and the idle probe, cross the relay's handshake. The
two-host version (Ray nodes in network namespaces with private folders) is
tests/distributed/test_session_on_another_node.py."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.jupyter_kernel import run_cell
from tests.web.test_session_proxy import RelayedEndpoints, Rig, open_rig
from trainhub.service.sessions import base_url

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with open_rig(tmp_path_factory.mktemp("relayed"), relayed=True) as built:
        yield built


def test_a_notebook_behind_a_relay_answers_http_and_runs_a_kernel_cell(rig: Rig) -> None:
    session = rig.start()
    base = session["url"].removesuffix("lab")
    page = httpx.get(rig.url + session["url"], headers=rig.headers(rig.alice), timeout=30)
    assert page.status_code == 200
    assert "JupyterLab" in page.text
    printed = run_cell(rig.url, base, rig.alice, "print('relayed', 6 * 7)")
    assert printed.strip() == "relayed 42"
    # refusals are the proxy's, before the relay
    assert httpx.get(rig.url + session["url"], timeout=30).status_code == 401
    answer = httpx.get(rig.url + session["url"], headers=rig.headers(rig.bob), timeout=30)
    assert answer.status_code == 404
    endpoints = rig.service.endpoints
    assert isinstance(endpoints, RelayedEndpoints)
    relay = endpoints.relays[f"t{session['trial_id']}-a1"]
    assert relay.relayed >= 2  # HTTP requests and the kernel's WebSocket went through it
    assert relay.refused == 0
    # the idle rule's probe asks the server through the relay too
    endpoint = endpoints.session_endpoint(f"t{session['trial_id']}-a1")
    assert endpoint is not None
    assert endpoint.relay == relay.address
    assert rig.service.probe is not None
    activity = rig.service.probe.activity(
        endpoint, rig.service.secret(int(session["id"])), base_url(int(session["id"]))
    )
    assert activity is not None
    assert activity[0] is not None


def test_a_terminal_behind_a_relay_runs_a_command(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainhub.cli.interactive import run_terminal
    from trainhub.client import TrainhubClient

    session = rig.start(kind="shell")
    with TrainhubClient(rig.url, rig.alice) as client:
        code = run_terminal(client, session, "echo relayed-$((6*7))")
    assert code == 0
    assert "relayed-42" in capsys.readouterr().out
