"""The sessions' REST routes: start, list, show, stop; what a session may ask for (422 at
submit); the tenant limits; the proxy of a session that does not serve yet."""

from __future__ import annotations

import pytest
from starlette.testclient import WebSocketDenialResponse

from tests.fixtures.api import Api

SESSIONS = "/api/v1/sessions"


def test_a_session_is_an_experiment_of_the_sessions_project_queued_like_a_trial(
    bapi: Api,
) -> None:
    alice = bapi.user("alice", "default")
    r = bapi.client.post(
        SESSIONS,
        json={"kind": "notebook", "gpus": 0, "idle_timeout_s": 600, "data": []},
        headers=bapi.headers(alice),
    )
    assert r.status_code == 201, r.text
    session = r.json()
    assert session["state"] == "QUEUED"
    assert session["owner"] == "alice"
    assert session["url"] == f"/ui/sessions/{session['id']}/server/lab"
    assert session["idle_timeout_s"] == 600
    experiment = bapi.client.get(
        f"/api/v1/experiments/{session['id']}", headers=bapi.headers(alice)
    ).json()
    spec = experiment["spec"]
    assert spec["project"] == "sessions"
    assert spec["entrypoint"] == "python -m trainhub.runtime.session_server"
    assert spec["session"]["kind"] == "notebook"
    secret = bapi.services.sessions.secret(int(session["id"]))  # type: ignore[union-attr]
    assert secret not in str(experiment)  # derived at launch, never stored or shown

    listed = bapi.client.get(SESSIONS, headers=bapi.headers(alice)).json()
    assert [s["id"] for s in listed["data"]] == [session["id"]]
    # a plain experiment is not a session
    assert bapi.client.get(f"{SESSIONS}/999", headers=bapi.headers(alice)).status_code == 404

    stopped = bapi.client.post(f"{SESSIONS}/{session['id']}/stop", headers=bapi.headers(alice))
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["state"] == "CANCELED"
    assert bapi.client.get(SESSIONS, headers=bapi.headers(alice)).json()["count"] == 0
    everything = bapi.client.get(SESSIONS, params={"all": True}, headers=bapi.headers(alice))
    assert everything.json()["count"] == 1


def test_a_session_beyond_what_its_tenant_allows_is_refused_at_submit(bapi: Api) -> None:
    alice = bapi.user("alice", "default")
    limits = "/api/v1/tenants/default/session-limits"
    refused = bapi.client.put(limits, json={"max_gpus": 1}, headers=bapi.headers(alice))
    assert refused.status_code == 403
    r = bapi.client.put(limits, json={"max_gpus": 1, "max_length_s": 3600}, headers=bapi.headers())
    assert r.status_code == 200, r.text
    assert bapi.client.get(limits, headers=bapi.headers(alice)).json() == {
        "max_gpus": 1,
        "max_length_s": 3600.0,
    }
    r = bapi.client.post(SESSIONS, json={"gpus": 2}, headers=bapi.headers(alice))
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["path"] == "gpus"
    assert "at most 1" in error["message"]
    assert bapi.client.get(SESSIONS, headers=bapi.headers(alice)).json()["count"] == 0


def test_bad_session_requests_name_their_field(bapi: Api) -> None:
    alice = bapi.user("alice", "default")
    for body, field in (
        ({"kind": "desktop"}, "kind"),
        ({"idle_timeout_s": 1}, "idle_timeout_s"),
        ({"gpus": -1}, "gpus"),
        ({"data": ["no-mount"]}, "data[0]"),
        ({"kind": "tensorboard"}, "trials"),
        ({"kind": "tensorboard", "trials": [12345]}, None),
    ):
        r = bapi.client.post(SESSIONS, json=body, headers=bapi.headers(alice))
        assert 400 <= r.status_code < 500, (body, r.text)
        if field is not None:
            paths = [e["path"] for e in r.json().get("errors", [])]
            assert any(field in p for p in paths), (body, r.json())


def test_the_proxy_refuses_strangers_and_says_when_a_session_does_not_serve_yet(
    bapi: Api,
) -> None:
    alice = bapi.user("alice", "default")
    bob = bapi.user("bob", "teamb")
    session = bapi.client.post(SESSIONS, json={}, headers=bapi.headers(alice)).json()
    page = session["url"]
    assert bapi.client.get(page).status_code == 401
    assert bapi.client.get(page, headers=bapi.headers(bob)).status_code == 404
    waiting = bapi.client.get(page, headers=bapi.headers(alice))
    assert waiting.status_code == 503
    assert waiting.json()["code"] == "session_not_ready"
    # a WebSocket is refused before it is accepted, with the same answer as HTTP
    events = page.removesuffix("lab") + "api/events/subscribe"
    for headers, status in (({}, 401), (bapi.headers(bob), 404), (bapi.headers(alice), 503)):
        socket = bapi.client.websocket_connect(events, headers=headers)
        with pytest.raises(WebSocketDenialResponse) as refused, socket:
            pass
        assert refused.value.status_code == status
