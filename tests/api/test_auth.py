"""Every route authenticates; users see only their tenants' objects; viewers cannot submit."""

from __future__ import annotations

import pytest

from tests.fixtures.api import Api, make_context

SPEC = "name: demo\nentrypoint: python train.py\n"
CONTEXT = make_context({"train.py": b"print('hi')\n"})


def submit(api: Api, token: str, spec: str = SPEC, context: bytes | None = CONTEXT, **form: str):
    files = {"context": ("context.tar.gz", context, "application/gzip")} if context else None
    return api.client.post(
        "/api/v1/experiments", data={"spec": spec, **form}, files=files, headers=api.headers(token)
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/experiments"),
        ("post", "/api/v1/experiments"),
        ("get", "/api/v1/experiments/1"),
        ("get", "/api/v1/trials/1"),
        ("get", "/api/v1/trials/1/logs"),
        ("get", "/api/v1/trials/1/metrics"),
        ("post", "/api/v1/trials/1/metrics"),
        ("get", "/api/v1/trials/1/checkpoints"),
        ("get", "/api/v1/tenants"),
        ("get", "/api/v1/users"),
        ("get", "/api/v1/tokens"),
        ("get", "/api/v1/me"),
    ],
)
def test_every_route_needs_a_token(api: Api, method: str, path: str) -> None:
    r = api.client.request(method, path)
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    r = api.client.request(method, path, headers={"Authorization": "Bearer th_wrong"})
    assert r.status_code == 401


def test_tokens_are_stored_only_as_hashes_and_shown_once(api: Api) -> None:
    r = api.client.post("/api/v1/tokens", json={"name": "laptop"}, headers=api.headers())
    assert r.status_code == 201
    secret = r.json()["token"]
    listed = api.client.get("/api/v1/tokens", headers=api.headers()).json()["data"]
    assert all("token" not in t for t in listed)
    from sqlalchemy import text

    with api.services.uow.engine.connect() as conn:  # type: ignore[attr-defined]
        stored = [row[0] for row in conn.execute(text("select token_hash from tokens"))]
    assert secret not in stored
    assert all(len(h) == 64 for h in stored)
    # a revoked token stops working
    token_id = r.json()["id"]
    assert api.client.get("/api/v1/me", headers=api.headers(secret)).status_code == 200
    assert api.client.delete(f"/api/v1/tokens/{token_id}", headers=api.headers()).status_code == 204
    assert api.client.get("/api/v1/me", headers=api.headers(secret)).status_code == 401


def test_other_tenants_objects_are_not_found(api: Api) -> None:
    alice = api.user("alice", "vision")
    bob = api.user("bob", "speech")
    r = submit(api, alice)
    assert r.status_code == 201, r.text
    experiment_id = r.json()["id"]
    trial_id = r.json()["trials"][0]["id"]
    assert (
        api.client.get(
            f"/api/v1/experiments/{experiment_id}", headers=api.headers(alice)
        ).status_code
        == 200
    )
    for path in (
        f"/api/v1/experiments/{experiment_id}",
        f"/api/v1/trials/{trial_id}",
        f"/api/v1/trials/{trial_id}/metrics",
        f"/api/v1/trials/{trial_id}/logs",
        f"/api/v1/trials/{trial_id}/checkpoints",
    ):
        r = api.client.get(path, headers=api.headers(bob))
        assert r.status_code == 404, path
    assert (
        api.client.post(f"/api/v1/trials/{trial_id}/cancel", headers=api.headers(bob)).status_code
        == 404
    )
    assert api.client.get("/api/v1/experiments", headers=api.headers(bob)).json()["count"] == 0
    assert api.client.get("/api/v1/experiments", headers=api.headers(alice)).json()["count"] == 1
    # the admin sees everything
    assert api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers()).status_code == 200


def test_viewers_cannot_submit_or_cancel(api: Api) -> None:
    member = api.user("carol", "vision")
    viewer = api.user("dave", "vision", role="viewer")
    r = submit(api, viewer, tenant="vision")
    assert r.status_code == 403
    assert "viewer" in r.json()["message"]
    trial_id = submit(api, member).json()["trials"][0]["id"]
    assert (
        api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(viewer)).status_code == 200
    )
    r = api.client.post(f"/api/v1/trials/{trial_id}/cancel", headers=api.headers(viewer))
    assert r.status_code == 403


def test_only_admins_manage_users_and_tenants(api: Api) -> None:
    member = api.user("erin", "vision")
    h = api.headers(member)
    assert api.client.post("/api/v1/tenants", json={"name": "x"}, headers=h).status_code == 403
    assert api.client.get("/api/v1/users", headers=h).status_code == 403
    assert api.client.post("/api/v1/users", json={"username": "y"}, headers=h).status_code == 403
    assert (
        api.client.post("/api/v1/tokens", json={"username": "admin"}, headers=h).status_code == 403
    )


def test_trial_tokens_reach_only_their_trial(api: Api) -> None:
    alice = api.user("frank", "vision")
    first = submit(api, alice).json()["trials"][0]["id"]
    second = submit(api, alice).json()["trials"][0]["id"]
    from tests.api.trials import start_attempt

    h = start_attempt(api, first)
    body = {"attempt": 1, "points": [{"step": 1, "values": {"loss": 0.5}}]}
    assert (
        api.client.post(f"/api/v1/trials/{first}/metrics", json=body, headers=h).status_code == 200
    )
    assert (
        api.client.post(f"/api/v1/trials/{second}/metrics", json=body, headers=h).status_code == 404
    )
    assert api.client.get("/api/v1/experiments", headers=h).status_code == 403
    assert api.client.get(f"/api/v1/trials/{first}/signals", headers=h).json() == {
        "should_stop": False,
        "reason": None,
    }
