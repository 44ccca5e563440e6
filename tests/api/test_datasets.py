"""Dataset routes over the API as the model registry's rules say: members push and remove,
viewers read, tenant admins share, everyone else gets 404; pushes checked before the body."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import build_bounded_api
from tests.api.test_auth import SPEC, submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api

BODY = b"pretend tar archive"
SHA = hashlib.sha256(BODY).hexdigest()


@dataclass
class World:
    api: Api
    alice: str  # member of vision
    vadmin: str  # admin of vision
    viewer: str  # viewer of vision
    bob: str  # member of speech

    def call(self, method: str, path: str, token: str, **kw: object) -> httpx.Response:
        return self.api.client.request(
            method, f"/api/v1{path}", headers=self.api.headers(token), **kw
        )

    def push(self, token: str, name: str, body: bytes = BODY, **params: str) -> httpx.Response:
        sha = hashlib.sha256(body).hexdigest()
        return self.call(
            "PUT",
            f"/datasets/{name}/archive",
            token,
            params={"sha256": sha, **params},
            content=body,
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    api = build_bounded_api(Path(tmp_path_factory.mktemp("datasets")))
    with api.client:
        w = World(
            api,
            api.user("alice", "vision"),
            api.user("vera", "vision", "admin"),
            api.user("vic", "vision", "viewer"),
            api.user("bob", "speech"),
        )
        assert w.push(w.alice, "flowers").status_code == 201
        yield w
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_members_push_viewers_read_others_see_nothing(world: World) -> None:
    w = world
    got = w.call("GET", "/datasets/flowers", w.viewer)
    assert got.status_code == 200
    assert got.json()["latest"]["ref"] == "vision/flowers:1"
    assert w.push(w.viewer, "flowers", b"other").status_code == 403
    assert w.call("DELETE", "/datasets/flowers", w.viewer).status_code == 403
    assert w.call("GET", "/datasets/flowers", w.bob).status_code == 404
    assert w.call("GET", "/datasets/flowers/versions/1", w.bob).status_code == 404
    assert w.call("DELETE", "/datasets/flowers", w.bob).status_code == 404
    assert w.push(w.bob, "flowers", tenant="vision").status_code == 404
    assert w.call("GET", "/datasets", w.bob).json()["count"] == 0


def test_tenant_admins_share_and_the_other_tenant_reads(world: World) -> None:
    w = world
    assert w.call("PUT", "/datasets/flowers/shares/speech", w.alice).status_code == 403
    assert w.call("PUT", "/datasets/flowers/shares/speech", w.bob).status_code == 404
    shared = w.call("PUT", "/datasets/flowers/shares/speech", w.vadmin)
    assert shared.status_code == 200
    assert shared.json()["shared_with"] == ["speech"]
    seen = w.call("GET", "/datasets/flowers", w.bob, params={"tenant": "vision"})
    assert seen.status_code == 200
    assert seen.json()["shared_with"] == ["speech"]
    assert w.call("DELETE", "/datasets/flowers/shares/speech", w.vadmin).status_code == 200
    assert w.call("GET", "/datasets/flowers", w.bob).status_code == 404


def test_known_content_needs_no_upload_and_bad_pushes_store_nothing(world: World) -> None:
    w = world
    known = w.call("POST", "/datasets/copy/versions", w.alice, json={"sha256": SHA})
    assert known.status_code == 201, known.text
    assert (known.json()["ref"], known.json()["stored_bytes"]) == ("vision/copy:1", 0)
    unknown = w.call("POST", "/datasets/copy/versions", w.alice, json={"sha256": "e" * 64})
    assert unknown.status_code == 404
    # the other tenant cannot learn what content vision holds
    probe = w.call("POST", "/datasets/copy/versions", w.bob, json={"sha256": SHA})
    assert probe.status_code == 404
    wrong = w.call(
        "PUT",
        "/datasets/bad/archive",
        w.alice,
        params={"sha256": "0" * 64},
        content=b"not what was announced",
    )
    assert wrong.status_code == 400
    assert "SHA-256" in wrong.json()["message"]
    assert w.call("GET", "/datasets/bad", w.alice).status_code == 404


def test_the_storage_quota_is_checked_before_the_body(world: World) -> None:
    w = world
    r = w.api.client.patch(
        "/api/v1/tenants/speech", json={"max_storage_bytes": 1000}, headers=w.api.headers()
    )
    assert r.status_code == 200, r.text
    assert w.push(w.bob, "small", b"x" * 500).status_code == 201
    big = w.push(w.bob, "big", b"y" * 600)
    assert big.status_code == 413
    assert "storage quota" in big.json()["message"]
    assert w.call("GET", "/datasets/big", w.bob).status_code == 404
    # checkpoints share the quota with datasets: 500 of 1000 bytes are taken
    trial_id = submit(w.api, w.bob).json()["trials"][0]["id"]
    own = start_attempt(w.api, trial_id)
    upload = w.api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": "c1", "step": 1},
        content=b"z" * 600,
        headers=own,
    )
    assert upload.status_code == 413, upload.text


def test_a_spec_naming_a_dataset_is_pinned(world: World) -> None:
    w = world
    spec = SPEC + "data: [{name: flowers, mount: /data/flowers}]\n"
    r = submit(w.api, w.alice, spec)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["data"] == [
        {"name": "vision/flowers", "version": 1, "mount": "/data/flowers"}
    ]
    r = submit(w.api, w.bob, spec)
    assert r.status_code == 422
    assert [e["path"] for e in r.json()["errors"]] == ["data[0].name"]
