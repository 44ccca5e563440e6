"""A folder store migrated into a bucket (SeaweedFS), every object verified; reruns resume."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.service.storage_migration import migrate_store


def filled(root: Path) -> LocalArtifactStore:
    store = LocalArtifactStore(root)
    store.put("tenants/a/contexts/experiment-1.tar.gz", b"ctx")
    store.put("tenants/a/logs/trial-1/attempt-1/rank-0.log", b"line\n" * 1000)
    store.put_file("tenants/a/checkpoints/trial-1/u.ckpt", io.BytesIO(os.urandom(6 << 20)))
    return store


def test_a_folder_moves_into_a_bucket_verified(seaweed: SeaweedS3, tmp_path: Path) -> None:
    source = filled(tmp_path / "artifacts")
    target = seaweed.store(part_bytes=5 << 20, concurrency=2)
    report = migrate_store(source, target)
    assert report.ok
    assert (report.copied, report.skipped) == (3, 0)
    assert target.list("") == source.list("")
    for blob in source.list(""):
        assert target.get(blob.key) == source.get(blob.key)
    # a second run copies nothing; a changed object is copied again
    source.put("tenants/a/contexts/experiment-1.tar.gz", b"changed")
    again = migrate_store(source, target)
    assert (again.copied, again.skipped) == (1, 2)
    assert target.get("tenants/a/contexts/experiment-1.tar.gz") == b"changed"


def test_the_cli_migrates_and_says_how_to_switch(seaweed: SeaweedS3, tmp_path: Path) -> None:
    filled(tmp_path / "artifacts")
    url = seaweed.new_url("cluster")
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "trainhub"),
            "storage",
            "migrate",
            "--from",
            str(tmp_path / "artifacts"),
            "--to",
            url,
            "--s3-endpoint",
            seaweed.endpoint,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **seaweed.env},
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "copied 3 objects" in out.stdout
    assert f"--storage {url}" in out.stdout
