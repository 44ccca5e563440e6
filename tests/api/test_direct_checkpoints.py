"""A rank's checkpoints straight to and from the bucket (``--rank-storage direct``, ADR 0033).

The API runs in-process on a real database with a real S3 server (SeaweedFS) behind it; the
runtime's own client (``ControlPlaneClient``, what ``ctx.save_checkpoint`` and ``ctx.restore``
use) saves and restores through a real uvicorn. The rank holds a trial token and presigned
URLs only; another trial's token is refused; the control plane's route stays the default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api, build_api, serve
from tests.fixtures.control_plane import free_port
from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.api.app import create_app
from trainhub.runtime.transport import ControlPlaneClient, ControlPlaneError
from trainhub.service.direct_checkpoints import DirectCheckpoints
from trainhub.service.ports import DirectDownload, DirectUpload
from trainhub.service.tracking import TrackingService

MIB = 1 << 20


def bucket_api(db_url: str, root: Path, seaweed: SeaweedS3, route: str) -> Api:
    """The API on an S3 store, ranks' checkpoints by ``route``."""
    base = build_api(db_url, root)
    store = seaweed.store(part_bytes=5 * MIB)
    tracking = TrackingService(base.services.uow, store, base.services.clock)
    services = dataclasses.replace(
        base.services,
        tracking=tracking,
        direct_checkpoints=DirectCheckpoints(tracking, store, route),
    )
    return Api(TestClient(create_app(services)), base.admin_token, services, base.store)


@pytest.fixture
def direct_api(db_url: str, tmp_path: Path, seaweed: SeaweedS3) -> Iterator[Api]:
    built = bucket_api(db_url, tmp_path, seaweed, "direct")
    with built.client:
        yield built
    built.services.uow.engine.dispose()  # type: ignore[attr-defined]


def rank_client(url: str, headers: dict[str, str], trial_id: int) -> ControlPlaneClient:
    token = headers["Authorization"].removeprefix("Bearer ")
    return ControlPlaneClient(url, token, trial_id, timeout_s=30)


def test_a_rank_saves_and_restores_through_the_bucket_directly(
    direct_api: Api, tmp_path: Path
) -> None:
    api = direct_api
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    source = tmp_path / "state.pt"
    source.write_bytes(bytes(range(256)) * (12 * MIB // 256) + b"end")  # 3 parts of 5 MiB
    with serve(api.client.app) as port:
        url = f"http://127.0.0.1:{port}"
        client = rank_client(url, headers, trial_id)
        record = client.upload_checkpoint(source, uuid="c1", step=3, attempt=1, metrics={})
        assert client._route == "direct"
        assert record["size_bytes"] == source.stat().st_size
        # a retry of the same uuid registers nothing twice
        again = client.upload_checkpoint(source, uuid="c1", step=3, attempt=1, metrics={})
        assert again["id"] == record["id"]
        restored = tmp_path / "restored.pt"
        client.download_checkpoint(record["id"], restored)
        assert restored.read_bytes() == source.read_bytes()
        client.close()
    listed = api.client.get(f"/api/v1/trials/{trial_id}/checkpoints", headers=api.headers(user))
    assert [c["uuid"] for c in listed.json()["data"]] == ["c1"]


def test_another_trials_token_gets_no_url(direct_api: Api) -> None:
    api = direct_api
    user = api.user("alice", "vision")
    first = submit(api, user).json()["trials"][0]["id"]
    second = submit(api, user).json()["trials"][0]["id"]
    mine = start_attempt(api, first, 1)
    theirs = start_attempt(api, second, 1)
    body = {"uuid": "x1", "step": 1, "attempt": 1, "size_bytes": 10}
    # trial 2's token asking to write trial 1's checkpoint, and to read one of it
    r = api.client.post(f"/api/v1/trials/{first}/checkpoints/direct", json=body, headers=theirs)
    assert r.status_code in (403, 404), r.text
    r = api.client.post(f"/api/v1/trials/{first}/checkpoints/direct", json=body, headers=mine)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["route"] == "direct"
    assert f"trial-{first}/x1.ckpt" in plan["urls"][0]
    assert httpx.put(plan["urls"][0], content=b"0123456789").status_code == 200
    done = api.client.post(
        f"/api/v1/trials/{first}/checkpoints/direct/complete",
        json={**body, "upload_id": plan["upload_id"]},
        headers=mine,
    )
    assert done.status_code == 201, done.text
    checkpoint_id = done.json()["id"]
    path = f"/api/v1/trials/{second}/checkpoints/{checkpoint_id}/direct"
    assert api.client.get(path, headers=theirs).status_code == 404
    r = api.client.get(f"/api/v1/trials/{first}/checkpoints/{checkpoint_id}/direct", headers=mine)
    assert httpx.get(r.json()["url"]).content == b"0123456789"


def test_completion_with_parts_missing_is_refused_and_nothing_is_registered(
    direct_api: Api,
) -> None:
    api = direct_api
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    body = {"uuid": "half", "step": 1, "attempt": 1, "size_bytes": 6 * MIB}
    plan = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints/direct", json=body, headers=headers
    ).json()
    assert len(plan["urls"]) == 2
    assert httpx.put(plan["urls"][0], content=b"a" * (5 * MIB)).status_code == 200
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints/direct/complete",
        json={**body, "upload_id": plan["upload_id"]},
        headers=headers,
    )
    assert r.status_code == 400, r.text
    assert "misses parts [2]" in r.json()["message"]
    listed = api.client.get(f"/api/v1/trials/{trial_id}/checkpoints", headers=headers).json()
    assert listed["count"] == 0


def test_over_quota_is_refused_before_any_url(direct_api: Api) -> None:
    api = direct_api
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    body = {"uuid": "huge", "step": 1, "attempt": 1, "size_bytes": 10**15}
    r = api.client.post(f"/api/v1/trials/{trial_id}/checkpoints/direct", json=body, headers=headers)
    assert r.status_code == 413, r.text
    assert "urls" not in r.text


def test_the_control_plane_route_is_the_default(
    db_url: str, tmp_path: Path, seaweed: SeaweedS3
) -> None:
    api = bucket_api(db_url, tmp_path, seaweed, "control-plane")
    with api.client:
        user = api.user("alice", "vision")
        trial_id = submit(api, user).json()["trials"][0]["id"]
        headers = start_attempt(api, trial_id, 1)
        body = {"uuid": "c1", "step": 1, "attempt": 1, "size_bytes": 3}
        r = api.client.post(
            f"/api/v1/trials/{trial_id}/checkpoints/direct", json=body, headers=headers
        )
        assert r.json() == {
            "route": "control-plane",
            "upload_id": None,
            "part_bytes": None,
            "urls": [],
            "stored": {},
            "expires_in_s": None,
            "checkpoint": None,
        }
        source = tmp_path / "state.pt"
        source.write_bytes(b"abc")
        with serve(api.client.app) as port:
            client = rank_client(f"http://127.0.0.1:{port}", headers, trial_id)
            record = client.upload_checkpoint(source, uuid="c1", step=1, attempt=1, metrics={})
            assert client._route == "control-plane"
            restored = tmp_path / "restored.pt"
            client.download_checkpoint(record["id"], restored)
            assert restored.read_bytes() == b"abc"
            with pytest.raises(ControlPlaneError):
                client.download_checkpoint(record["id"] + 100, restored)
            client.close()
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]


class UnreachableUrls:
    """The store, signing URLs for an endpoint this rank cannot reach (a contained trial's
    network leads only to the control plane)."""

    def __init__(self, store: Any, dead_port: int) -> None:
        self.store = store
        self.dead = f"127.0.0.1:{dead_port}"
        self.live = store.endpoint_url.removeprefix("http://")

    def presign_upload(self, key: str, size: int, expires_s: int) -> DirectUpload:
        plan = self.store.presign_upload(key, size, expires_s)
        urls = tuple(u.replace(self.live, self.dead) for u in plan.urls)
        return dataclasses.replace(plan, urls=urls)

    def presign_download(self, key: str, expires_s: int) -> DirectDownload:
        found = self.store.presign_download(key, expires_s)
        return dataclasses.replace(found, url=found.url.replace(self.live, self.dead))

    def presigned_writer(self, key: str, upload_id: str, size: int) -> Any:
        return self.store.presigned_writer(key, upload_id, size)


def test_a_rank_that_cannot_reach_the_bucket_goes_through_the_control_plane(
    direct_api: Api, tmp_path: Path
) -> None:
    api = direct_api
    direct = api.services.direct_checkpoints
    assert direct is not None
    direct.store = UnreachableUrls(direct.store, free_port())
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    source = tmp_path / "state.pt"
    source.write_bytes(b"w" * (6 * MIB))
    with serve(api.client.app) as port:
        client = rank_client(f"http://127.0.0.1:{port}", headers, trial_id)
        record = client.upload_checkpoint(source, uuid="c1", step=1, attempt=1, metrics={})
        assert client._route == "control-plane"
        assert record["size_bytes"] == 6 * MIB
        again = rank_client(f"http://127.0.0.1:{port}", headers, trial_id)
        restored = tmp_path / "restored.pt"
        again.download_checkpoint(record["id"], restored)
        assert again._route == "control-plane"
        assert restored.read_bytes() == source.read_bytes()
        client.close()
        again.close()
