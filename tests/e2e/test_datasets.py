"""Tenant datasets end to end, on a real control plane process, the session's Ray head and the
bubblewrap sandbox: push, mount read-only, node cache, tenants, the bad input of a spec."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir
from trainhub.adapters.dataset_cache import DatasetCache
from trainhub.adapters.sandbox import bwrap_problem
from trainhub.client import TrainhubClient
from trainhub.client.datasets import archive_chunks, plan_archive, push_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKLOAD = Path(__file__).parent / "datasets_workload"


@dataclass
class World:
    plane: ControlPlaneProcess
    cache: Path
    bob: str  # member of tenant teamb
    tmp: Path

    def client(self, token: str | None = None) -> TrainhubClient:
        return TrainhubClient(self.plane.url, token or self.plane.token)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.plane.token}"}

    def folder(self, name: str, greeting: str) -> Path:
        root = self.tmp / name
        (root / "sub").mkdir(parents=True)
        (root / "greeting.txt").write_text(greeting + "\n")
        (root / "sub" / "numbers.csv").write_text("a,b\n1,2\n")
        return root

    def submit(self, data: list[dict[str, object]], token: str | None = None) -> httpx.Response:
        spec = {
            "name": "reader",
            "entrypoint": "python read_mount.py " + " ".join(str(d["mount"]) for d in data),
            "resources": {"workers": 1, "cpus_per_worker": 1},
            "max_restarts": 0,
            "data": data,
        }
        return httpx.post(
            f"{self.plane.url}/api/v1/experiments",
            data={"spec": json.dumps(spec)},
            files={"context": ("c.tar.gz", pack_dir(WORKLOAD), "application/gzip")},
            headers=self.headers(token),
            timeout=30,
        )


@pytest.fixture(scope="module")
def world(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    tmp = tmp_path_factory.mktemp("datasets")
    home = tmp / "home"
    home.mkdir()
    cache = tmp / "node-cache"
    plane = ControlPlaneProcess(
        home, ray_address, settings={"sandbox": "bwrap", "dataset_cache_dir": str(cache)}
    )
    plane.start()
    try:
        with TrainhubClient(plane.url, plane.token) as admin:
            admin.create_tenant("teamb")
            admin.create_user("bob")
            admin.set_membership("bob", "teamb", "member")
            bob = admin.create_token("bob", username="bob")["token"]
        yield World(plane, cache, bob, tmp)
    finally:
        plane.stop()


def _completed(w: World, response: httpx.Response) -> tuple[int, str]:
    assert response.status_code == 201, response.text
    trial_id = response.json()["trials"][0]["id"]
    w.plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    return trial_id, w.plane.log(trial_id, 0)


def test_a_pushed_dataset_is_mounted_read_only_and_cached_once_per_node(world: World) -> None:
    w = world
    with w.client() as admin:
        pushed = push_dataset(admin, "greetings", w.folder("greetings-v1", "hello"))
    assert pushed["ref"] == "default/greetings:1"
    assert pushed["stored_bytes"] == pushed["size_bytes"] > 0

    first = w.submit([{"name": "greetings", "mount": "/data/greetings"}])
    _, log = _completed(w, first)
    assert "READ /data/greetings hello" in log, log
    # a read-only mount (EROFS); where the trial runs as a uid of its own, the files are not
    # its own either (EACCES comes first)
    for change in ("create", "overwrite", "remove", "mkdir"):
        assert f"WRITE_REFUSED /data/greetings {change} E" in log, log
    assert "WRITE_REFUSED /data/greetings create EROFS" in log
    assert "WRITE_ALLOWED" not in log
    assert "SEEN ['greetings']" in log  # nothing else of the node's cache or of other tenants
    assert "dataset default/greetings:1 at /data/greetings: fetched" in log
    # pinned at submit, shown with the experiment
    spec = w.plane.request("GET", f"/experiments/{first.json()['id']}").json()["spec"]
    assert spec["data"] == [{"name": "default/greetings", "version": 1, "mount": "/data/greetings"}]

    sha = pushed["sha256"]
    record = DatasetCache(w.cache).record(sha)
    assert record is not None
    assert (record.fetches, record.hits) == (1, 0)

    second = w.submit([{"name": "greetings", "version": 1, "mount": "/data/g"}])
    _, log = _completed(w, second)
    assert "READ /data/g hello" in log
    assert "node cache hit, copied nothing" in log
    record = DatasetCache(w.cache).record(sha)
    assert record is not None
    assert (record.fetches, record.hits) == (1, 1)  # the second trial copied nothing


def test_another_tenant_sees_a_dataset_only_once_it_is_shared(world: World) -> None:
    w = world
    with w.client() as admin:
        push_dataset(admin, "private", w.folder("private", "secret"))

    def refused(name: str) -> dict[str, object]:
        r = w.submit([{"name": name, "mount": "/data/x"}], token=w.bob)
        assert r.status_code == 422, r.text
        return dict(r.json())

    # exactly the answer for a dataset that does not exist
    hidden = refused("default/private")
    missing = refused("default/nosuch")
    assert json.dumps(hidden).replace("private", "NAME") == json.dumps(missing).replace(
        "nosuch", "NAME"
    )
    assert [e["path"] for e in hidden["errors"]] == ["data[0].name"]  # type: ignore[union-attr]
    for path in ("/datasets/private?tenant=default", "/datasets/nosuch?tenant=default"):
        r = httpx.get(f"{w.plane.url}/api/v1{path}", headers=w.headers(w.bob), timeout=10)
        assert r.status_code == 404
    with w.client(w.bob) as bob:
        assert [d["name"] for d in bob._json("GET", "/datasets")["data"]] == []

    r = w.plane.request("PUT", "/datasets/private/shares/teamb")
    assert r.status_code == 200, r.text
    _, log = _completed(w, w.submit([{"name": "default/private", "mount": "/data/p"}], w.bob))
    assert "READ /data/p secret" in log
    # bob's tenant sees that it is shared with it, and nothing it may not change
    r = httpx.delete(
        f"{w.plane.url}/api/v1/datasets/private?tenant=default", headers=w.headers(w.bob)
    )
    assert r.status_code == 404
    r = w.plane.request("DELETE", "/datasets/private/shares/teamb")
    assert r.status_code == 200
    assert w.submit([{"name": "default/private", "mount": "/data/p"}], w.bob).status_code == 422


def test_bad_data_entries_are_refused_at_submit_with_their_field(world: World) -> None:
    w = world
    with w.client() as admin:
        push_dataset(admin, "tiny", w.folder("tiny", "hi"))
    before = w.plane.request("GET", "/experiments").json()["count"]
    cases = [
        ([{"name": "tiny", "mount": "data/tiny"}], "data[0].mount", "relative"),
        ([{"name": "tiny", "mount": "/usr/share/tiny"}], "data[0].mount", "/usr"),
        ([{"name": "tiny", "mount": "/trial/code/x"}], "data[0].mount", "/trial"),
        ([{"name": "tiny", "mount": "/tmp"}], "data[0].mount", "/tmp"),
        ([{"name": "tiny", "mount": "/proc/x"}], "data[0].mount", "/proc"),
        ([{"name": "tiny", "mount": sys.prefix + "/data"}], "data[0].mount", "sandbox needs"),
        (
            [{"name": "tiny", "mount": "/data/a"}, {"name": "tiny", "mount": "/data/a"}],
            "data[1].mount",
            "repeats data[0].mount",
        ),
        ([{"name": "tiny", "version": 7, "mount": "/data/a"}], "data[0].version", "no version 7"),
        ([{"name": "ghost", "mount": "/data/a"}], "data[0].name", "does not exist"),
        ([{"name": "tiny", "mount": "/data/a", "extra": 1}], "data[0].extra", "unknown field"),
    ]
    for data, path, words in cases:
        r = w.submit(data)
        assert r.status_code == 422, (data, r.text)
        errors = r.json()["errors"]
        assert [e["path"] for e in errors] == [path], (data, errors)
        assert words in errors[0]["message"], (data, errors)
    assert w.plane.request("GET", "/experiments").json()["count"] == before  # nothing queued


def test_the_same_content_is_stored_once(world: World) -> None:
    w = world
    folder = w.folder("twice", "same")
    with w.client() as admin:
        first = push_dataset(admin, "twice", folder)
        again = push_dataset(admin, "twice", folder)
        other = push_dataset(admin, "twice-copy", folder)
        changed = (folder / "greeting.txt").write_text("changed\n")
        assert changed
        newer = push_dataset(admin, "twice", folder)
    assert first["stored_bytes"] > 0
    assert (again["version"], again["stored_bytes"]) == (1, 0)  # nothing new: version 1
    assert (other["ref"], other["stored_bytes"]) == ("default/twice-copy:1", 0)
    assert other["sha256"] == first["sha256"]
    assert newer["version"] == 2
    assert newer["stored_bytes"] > 0
    blobs = w.plane.home / "artifacts" / "tenants" / "default" / "datasets" / "sha256"
    assert (blobs / f"{first['sha256']}.tar").is_file()
    same = [p for p in blobs.iterdir() if p.name == f"{first['sha256']}.tar"]
    assert len(same) == 1
    # the blob is what was announced
    digest = hashlib.sha256((blobs / f"{first['sha256']}.tar").read_bytes()).hexdigest()
    assert digest == first["sha256"]

    # content is deleted with the last version that refers to it
    with w.client() as admin:
        assert admin._json("DELETE", "/datasets/twice-copy")["removed"] == ["default/twice-copy:1"]
        assert (blobs / f"{first['sha256']}.tar").is_file()  # twice:1 still refers to it
        removed = admin._json("DELETE", "/datasets/twice", params={"version": 1})["removed"]
        assert removed == ["default/twice:1"]
        assert not (blobs / f"{first['sha256']}.tar").exists()
        assert [v["version"] for v in admin._json("GET", "/datasets/twice")["versions"]] == [2]
    assert w.submit([{"name": "twice", "version": 1, "mount": "/data/t"}]).status_code == 422


def test_an_interrupted_push_leaves_no_version(world: World) -> None:
    w = world
    folder = w.folder("cut", "cut")
    (folder / "big.bin").write_bytes(b"\x01" * (8 << 20))
    plan = plan_archive(folder)

    def half() -> Iterator[bytes]:
        sent = 0
        for chunk in archive_chunks(plan.members):
            yield chunk
            sent += len(chunk)
            if sent > plan.size_bytes // 2:
                raise ConnectionAbortedError("the pushing machine went away")

    with pytest.raises(ConnectionAbortedError):
        httpx.put(
            f"{w.plane.url}/api/v1/datasets/cut/archive",
            params={"sha256": plan.sha256},
            content=half(),
            headers={**w.headers(), "Content-Length": str(plan.size_bytes)},
            timeout=30,
        )
    blobs = w.plane.home / "artifacts" / "tenants" / "default" / "datasets" / "sha256"

    def temporary() -> list[str]:
        return [p.name for p in blobs.glob(".tmp-*")]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and temporary():
        time.sleep(0.2)  # the server drops the temporary file once it sees the connection end
    assert temporary() == []
    assert w.plane.request("GET", "/datasets/cut").status_code == 404
    assert not (blobs / f"{plan.sha256}.tar").exists()
    # a body whose hash is not the one announced is refused and stores nothing either
    r = httpx.put(
        f"{w.plane.url}/api/v1/datasets/cut/archive",
        params={"sha256": "0" * 64},
        content=b"".join(archive_chunks(plan.members)),
        headers=w.headers(),
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert w.plane.request("GET", "/datasets/cut").status_code == 404
    assert not (blobs / ("0" * 64 + ".tar")).exists()


def test_pushes_follow_roles_and_the_storage_quota(world: World) -> None:
    w = world
    with TrainhubClient(w.plane.url, w.plane.token) as admin:
        admin.create_user("vic")
        admin.set_membership("vic", "teamb", "viewer")
        vic = admin.create_token("vic", username="vic")["token"]
        admin.update_tenant("teamb", max_storage_bytes=64 * 1024)
    folder = w.folder("roles", "roles")
    plan = plan_archive(folder)
    url = f"{w.plane.url}/api/v1/datasets/roles/archive"

    def put(token: str, tenant: str) -> httpx.Response:
        return httpx.put(
            url,
            params={"sha256": plan.sha256, "tenant": tenant},
            content=b"".join(archive_chunks(plan.members)),
            headers=w.headers(token),
            timeout=30,
        )

    assert put(vic, "teamb").status_code == 403  # viewers read, members push
    assert put(w.bob, "default").status_code == 404  # not bob's tenant: nothing to see
    assert put(w.bob, "teamb").status_code == 201
    (folder / "big.bin").write_bytes(b"\x02" * (128 * 1024))
    big = plan_archive(folder)
    r = httpx.put(
        url,
        params={"sha256": big.sha256, "tenant": "teamb"},
        content=b"".join(archive_chunks(big.members)),
        headers=w.headers(w.bob),
        timeout=30,
    )
    assert r.status_code == 413, r.text
    assert "storage quota" in r.json()["message"]


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-data"


def test_the_own_data_example_trains_on_its_pushed_dataset(world: World) -> None:
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    w = world
    data = w.tmp / "own-data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(data)], check=True)
    env = {"TRAINHUB_URL": w.plane.url, "TRAINHUB_TOKEN": w.plane.token}
    runner = CliRunner()
    pushed = runner.invoke(app, ["data", "push", "spirals", str(data)], env=env)
    assert pushed.exit_code == 0, pushed.output
    assert "default/spirals:1" in pushed.output
    again = runner.invoke(app, ["data", "push", "spirals", str(data)], env=env)
    assert "content known: nothing uploaded" in again.output, again.output
    listed = runner.invoke(app, ["data", "ls"], env=env)
    assert "spirals" in listed.output

    spec = (EXAMPLE / "experiment.yaml").read_text()
    r = httpx.post(
        f"{w.plane.url}/api/v1/experiments",
        data={"spec": spec},
        files={"context": ("c.tar.gz", pack_dir(EXAMPLE), "application/gzip")},
        headers=w.headers(),
        timeout=30,
    )
    trial_id, log = _completed(w, r)
    assert "csv at /data/spirals" in log, log
    best = w.plane.trial(trial_id)["latest_metrics"]["val_accuracy"]
    assert best > 0.8, log
    shown = runner.invoke(app, ["show", str(r.json()["id"])], env=env)
    assert "default/spirals:1 at /data/spirals" in shown.output, shown.output


def test_without_a_sandbox_the_script_finds_the_cached_folder(
    ray_address: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cache = tmp_path / "cache"
    plane = ControlPlaneProcess(
        home, ray_address, settings={"sandbox": "none", "dataset_cache_dir": str(cache)}
    )
    plane.start()
    try:
        w = World(plane, cache, "", tmp_path)
        with w.client() as admin:
            pushed = push_dataset(admin, "plain", w.folder("plain", "bare"))
        spec = {
            "name": "bare",
            "entrypoint": "python read_unsandboxed.py /data/plain",
            "max_restarts": 0,
            "data": [{"name": "plain", "mount": "/data/plain"}],
        }
        r = httpx.post(
            f"{plane.url}/api/v1/experiments",
            data={"spec": json.dumps(spec)},
            files={"context": ("c.tar.gz", pack_dir(WORKLOAD), "application/gzip")},
            headers=w.headers(),
            timeout=30,
        )
        _, log = _completed(w, r)
        assert f"READ /data/plain bare FROM {cache / 'entries' / pushed['sha256']}" in log, log
    finally:
        plane.stop()
