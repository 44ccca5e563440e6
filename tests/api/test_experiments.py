"""Submit, list, show and cancel through the API; bad specs and unsafe contexts."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.api.test_auth import CONTEXT, SPEC, submit
from tests.fixtures.api import Api, make_context


def test_submit_list_show(api: Api) -> None:
    token = api.user("alice", "vision")
    r = submit(api, token)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["state"] == "ACTIVE"
    assert body["tenant"] == "vision"
    assert body["owner"] == "alice"
    (trial,) = body["trials"]
    assert trial["state"] == "QUEUED"
    assert trial["pending_reason"]
    listed = api.client.get("/api/v1/experiments", headers=api.headers(token)).json()
    assert listed["count"] == 1
    assert listed["data"][0]["id"] == body["id"]
    shown = api.client.get(f"/api/v1/trials/{trial['id']}", headers=api.headers(token)).json()
    assert shown["experiment_name"] == "demo"
    assert shown["attempts"] == []
    assert shown["events"][0]["kind"] == "submitted"
    with api.services.uow() as repo:
        experiment = repo.get_experiment(body["id"])
    assert experiment is not None
    assert experiment.context_key is not None
    assert experiment.context_key.startswith("tenants/vision/contexts/")
    assert api.store.exists(experiment.context_key)


def test_cancel_a_queued_trial(api: Api) -> None:
    token = api.user("alice", "vision")
    body = submit(api, token).json()
    r = api.client.post(f"/api/v1/experiments/{body['id']}/cancel", headers=api.headers(token))
    assert r.status_code == 200
    assert r.json()["state"] == "CANCELED"
    assert r.json()["trials"][0]["state"] == "CANCELED"
    # cancelling again is harmless
    r = api.client.post(
        f"/api/v1/trials/{body['trials'][0]['id']}/cancel", headers=api.headers(token)
    )
    assert r.status_code == 200
    assert r.json()["state"] == "CANCELED"


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ("name: demo\nentrypoint: python train.py\nresources: {workers: 0}\n", "resources.workers"),
        ("name: demo\nentrypoint: python train.py\nresorces: {}\n", "resorces"),
        ("name: demo\nentrypoint: python missing.py\n", "entrypoint"),
        ("name: demo\n", "entrypoint"),
        ("name: 'bad name!'\nentrypoint: python train.py\n", "name"),
    ],
)
def test_bad_specs_get_422_with_the_field_path(api: Api, spec: str, path: str) -> None:
    token = api.user("alice", "vision")
    r = submit(api, token, spec=spec)
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "invalid_spec"
    assert path in [e["path"] for e in body["errors"]]
    assert api.client.get("/api/v1/experiments", headers=api.headers(token)).json()["count"] == 0


def test_urgent_priority_is_for_admins(api: Api) -> None:
    token = api.user("alice", "vision")
    r = submit(api, token, spec=SPEC + "priority: urgent\n")
    assert r.status_code == 403
    assert submit(api, api.admin_token, spec=SPEC + "priority: urgent\n").status_code == 201


def _archive(add) -> bytes:  # type: ignore[no-untyped-def]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"#\n"))
        add(archive)
    return buffer.getvalue()


def _member(name: str, **kw: object):  # type: ignore[no-untyped-def]
    def add(archive: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        for key, value in kw.items():
            setattr(info, key, value)
        archive.addfile(info, io.BytesIO(b"x") if info.isfile() and info.size else None)

    return add


@pytest.mark.parametrize(
    "add",
    [
        _member("../evil.py", size=1),
        _member("/etc/evil", size=1),
        _member("a/../../evil", size=1),
        _member("link", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
        _member("sub/link", type=tarfile.SYMTYPE, linkname="../../outside"),
        _member("hard", type=tarfile.LNKTYPE, linkname="../outside"),
        _member("dev", type=tarfile.CHRTYPE),
    ],
)
def test_path_traversal_in_the_context_is_refused(api: Api, add) -> None:  # type: ignore[no-untyped-def]
    token = api.user("alice", "vision")
    r = submit(api, token, context=_archive(add))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_context"


def test_links_inside_the_context_are_fine(api: Api) -> None:
    token = api.user("alice", "vision")
    r = submit(
        api,
        token,
        context=_archive(_member("lib/link", type=tarfile.SYMTYPE, linkname="../train.py")),
    )
    assert r.status_code == 201, r.text


def test_garbage_context_and_size_limit(api: Api) -> None:
    token = api.user("alice", "vision")
    r = submit(api, token, context=b"not a tarball at all")
    assert r.status_code == 422
    assert r.json()["code"] == "invalid_context"
    api.services.experiments.max_context_bytes = 1000
    big = make_context({"train.py": b"#\n", "data.bin": bytes(range(256)) * 4000})
    r = submit(api, token, context=big)
    assert r.status_code == 413
    assert "limit" in r.json()["message"]
    assert submit(api, token, context=CONTEXT).status_code == 201


def test_openapi_schema(api: Api) -> None:
    schema = api.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/experiments" in schema["paths"]
    assert "/api/v1/trials/{trial_id}/logs" in schema["paths"]
