"""Sharded checkpoints through the API (ADR 0040): each rank stores its own files, the last
rank's report publishes the set; before it nothing is visible.

The runtime's own client (what the checkpoint thread of every rank uses) on a real uvicorn, a
real database, and both routes: the control plane's (a folder store) and presigned URLs to a
real S3 server (SeaweedFS).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_auth import submit
from tests.api.test_direct_checkpoints import bucket_api, rank_client
from tests.api.trials import start_attempt
from tests.fixtures.api import Api, build_api, serve
from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.runtime.transport import ControlPlaneClient, ControlPlaneError

MIB = 1 << 20


@pytest.fixture(params=["control-plane", "direct"])
def sets_api(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path
) -> Iterator[tuple[Api, str]]:
    if request.param == "direct":
        seaweed: SeaweedS3 = request.getfixturevalue("seaweed")
        built = bucket_api(db_url, tmp_path, seaweed, "direct")
    else:
        built = build_api(db_url, tmp_path)
    with built.client:
        yield built, request.param
    built.services.uow.engine.dispose()  # type: ignore[attr-defined]


def _files(folder: Path, names: dict[str, bytes]) -> dict[str, Path]:
    folder.mkdir(parents=True)
    paths = {}
    for name, data in names.items():
        (folder / name).write_bytes(data)
        paths[name] = folder / name
    return paths


def _store(
    client: ControlPlaneClient, uuid: str, paths: dict[str, Path]
) -> list[dict[str, object]]:
    entries = []
    for name, path in paths.items():
        client.upload_set_member(path, uuid=uuid, name=name, step=4, attempt=1)
        data = path.read_bytes()
        entries.append(
            {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
    return entries


def _report(entries: list[dict[str, object]]) -> dict[str, object]:
    return {"world_size": 2, "step": 4, "attempt": 1, "metrics": {"loss": 0.5}, "members": entries}


def test_the_last_rank_publishes_and_each_rank_reads_its_files(
    sets_api: tuple[Api, str], tmp_path: Path
) -> None:
    api, route = sets_api
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    rank0 = _files(
        tmp_path / "r0",
        {".metadata": b"index", "__0_0.distcp": b"a" * (6 * MIB), "shared.pt": b"s"},
    )
    rank1 = _files(tmp_path / "r1", {"__1_0.distcp": b"b" * (6 * MIB) + b"end"})
    listed = f"/api/v1/trials/{trial_id}/checkpoints"
    with serve(api.client.app) as port:
        url = f"http://127.0.0.1:{port}"
        first, second = rank_client(url, headers, trial_id), rank_client(url, headers, trial_id)
        answer = first.report_set_rank("s1", 0, _report(_store(first, "s1", rank0)))
        assert answer["published"] is False
        assert answer["ranks_reported"] == 1
        # rank 0's files are stored, the set is not: not listed, not counted
        assert api.client.get(listed, headers=headers).json()["count"] == 0
        answer = second.report_set_rank("s1", 1, _report(_store(second, "s1", rank1)))
        assert answer["published"] is True
        checkpoint = answer["checkpoint"]
        assert checkpoint["size_bytes"] == 12 * MIB + 9
        assert checkpoint["step"] == 4
        assert checkpoint["metrics"] == {"loss": 0.5}
        assert first._route == second._route == route
        # a retried report registers nothing twice
        again = first.report_set_rank("s1", 0, _report([]))
        assert again["checkpoint"]["id"] == checkpoint["id"]

        manifest = first.get_manifest(checkpoint["id"])
        assert manifest["sharded"] is True
        assert {m["name"] for m in manifest["members"]} == {*rank0, *rank1}
        assert manifest["meta"]["ranks"] == {"0": sorted(rank0), "1": sorted(rank1)}
        into = tmp_path / "restore"
        into.mkdir()
        second.download_set_member(checkpoint["id"], "__1_0.distcp", into / "__1_0.distcp")
        assert (into / "__1_0.distcp").read_bytes() == rank1["__1_0.distcp"].read_bytes()
        # one file is not what a set is
        whole = api.client.get(f"{listed}/{checkpoint['id']}/file", headers=headers)
        assert whole.status_code == 409, whole.text
        assert "sharded" in whole.json()["message"]
        first.close()
        second.close()
    kept = api.client.get(listed, headers=headers).json()["data"]
    assert [c["uuid"] for c in kept] == ["s1"]


def test_a_report_of_a_file_that_is_not_stored_publishes_nothing(
    sets_api: tuple[Api, str], tmp_path: Path
) -> None:
    api, _ = sets_api
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    headers = start_attempt(api, trial_id, 1)
    rank0 = _files(tmp_path / "r0", {".metadata": b"index", "__0_0.distcp": b"a" * 100})
    with serve(api.client.app) as port:
        client = rank_client(f"http://127.0.0.1:{port}", headers, trial_id)
        client.report_set_rank("s2", 0, _report(_store(client, "s2", rank0)))
        ghost = {"name": "__1_0.distcp", "size": 10, "sha256": "0" * 64}
        with pytest.raises(ControlPlaneError, match=r"__1_0\.distcp.*missing"):
            client.report_set_rank("s2", 1, _report([ghost]))
        client.close()
    listed = api.client.get(f"/api/v1/trials/{trial_id}/checkpoints", headers=headers)
    assert listed.json()["count"] == 0


def test_names_and_tokens_are_checked(sets_api: tuple[Api, str]) -> None:
    api, _ = sets_api
    user = api.user("alice", "vision")
    first = submit(api, user).json()["trials"][0]["id"]
    second = submit(api, user).json()["trials"][0]["id"]
    mine = start_attempt(api, first, 1)
    theirs = start_attempt(api, second, 1)
    member = f"/api/v1/trials/{first}/checkpoints/sets/s3/members"
    r = api.client.put(f"{member}/shard.bin?step=1", content=b"x", headers=theirs)
    assert r.status_code in (403, 404), r.text
    r = api.client.put(f"{member}/MANIFEST.json?step=1", content=b"x", headers=mine)
    assert r.status_code == 400, r.text
    assert "MANIFEST.json" in r.json()["message"]
    report = f"/api/v1/trials/{first}/checkpoints/sets/s3/ranks/2"
    r = api.client.post(report, json=_report([]), headers=mine)  # rank 2 of 2
    assert r.status_code == 400, r.text
    assert "rank must be 0-1" in r.json()["message"]
