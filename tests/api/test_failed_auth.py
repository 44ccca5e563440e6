"""The failed-authentication limit never locks out a valid token (issue 24, item 3).

Through a real uvicorn server on a free port: a client floods bad tokens from one address,
then a valid token from the same address works at once; the cluster's own node addresses are
never limited as a whole, only the token that keeps failing.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import Api, build_bounded_api
from tests.fixtures.api import serve
from trainhub.api.failed_auth import FailedAuthLimiter, NodeAddresses


def _bad() -> str:
    return "th_" + secrets.token_urlsafe(32)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[Api, str]]:
    """A real server whose limiter treats the client as a remote address (no node)."""
    limiter = FailedAuthLimiter(exempt=lambda _address: False)
    api = build_bounded_api(tmp_path, limiter)
    try:
        with serve(api.client.app) as port:
            yield api, f"http://127.0.0.1:{port}"
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_a_flood_of_bad_tokens_never_locks_out_a_valid_one(remote: tuple[Api, str]) -> None:
    api, url = remote
    codes = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(25):
            r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {_bad()}"})
            codes.append(r.status_code)
        assert codes[:20] == [401] * 20
        assert set(codes[20:]) == {429}, codes  # the address is limited for bad tokens
        limited = client.get("/api/v1/me", headers={"Authorization": f"Bearer {_bad()}"})
        assert limited.status_code == 429
        assert "127.0.0.1" in limited.json()["message"]
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        # the admin's valid token from the same address: at once, not after the window
        r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {api.admin_token}"})
        assert r.status_code == 200, r.text
        assert r.json()["username"] == "admin"


def test_node_addresses_are_never_locked_out_as_a_whole(tmp_path: Path) -> None:
    # the default limiter of create_app: loopback is this node's address
    api = build_bounded_api(tmp_path)
    try:
        with (
            serve(api.client.app) as port,
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
        ):
            # one trial floods with many different bad tokens: each is one failure
            for _ in range(30):
                r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {_bad()}"})
                assert r.status_code == 401, r.text
            # one token that keeps failing is slowed, on that token only
            stuck = _bad()
            codes = [
                client.get("/api/v1/me", headers={"Authorization": f"Bearer {stuck}"}).status_code
                for _ in range(22)
            ]
            assert codes == [401] * 20 + [429, 429], codes
            other = client.get("/api/v1/me", headers={"Authorization": f"Bearer {_bad()}"})
            assert other.status_code == 401  # the node's other clients: not limited
            r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {api.admin_token}"})
            assert r.status_code == 200
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_a_revoked_token_is_limited_by_its_principal(tmp_path: Path) -> None:
    now = [0.0]
    limiter = FailedAuthLimiter(max_failures=3, window_s=60, clock=lambda: now[0])
    limiter.exempt = lambda _address: True  # a node: only the token and its owner count
    api = build_bounded_api(tmp_path, limiter)
    with api.client:
        r = api.client.post("/api/v1/tokens", json={"name": "old"}, headers=api.headers())
        assert r.status_code == 201, r.text
        old = r.json()
        r = api.client.delete(f"/api/v1/tokens/{old['id']}", headers=api.headers())
        assert r.status_code == 204
        codes = [
            api.client.get("/api/v1/me", headers=api.headers(old["token"])).status_code
            for _ in range(4)
        ]
        assert codes == [401, 401, 401, 429]
        assert limiter.refusal(["principal:user-1"]) is not None  # the admin is user 1
        assert api.client.get("/api/v1/me", headers=api.headers()).status_code == 200
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_node_addresses_are_read_again_after_their_refresh() -> None:
    now = [0.0]
    reads = [["10.0.0.1"], ["10.0.0.2"]]
    nodes = NodeAddresses(lambda: reads.pop(0), refresh_s=30, clock=lambda: now[0])
    assert nodes("127.0.0.1")
    assert nodes("::1")
    assert nodes("10.0.0.1")
    assert not nodes("10.0.0.2")
    now[0] = 31.0
    assert nodes("10.0.0.2")
    assert not nodes("10.0.0.1")
    assert not nodes("testclient")


def test_the_keys_of_a_failure() -> None:
    limiter = FailedAuthLimiter(exempt=lambda address: address == "10.0.0.1")
    token = "th_" + "a" * 40
    assert limiter.keys("10.0.0.9", token, "trial-4") == [
        "token:th_aaaaaaa",
        "principal:trial-4",
        "address:10.0.0.9",
    ]
    assert limiter.keys("10.0.0.1", token) == ["token:th_aaaaaaa"]
