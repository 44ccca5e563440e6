"""What only a bucket does, against a real S3 server (SeaweedFS): parallel multipart uploads,
a killed upload that leaves nothing visible and resumes sending only missing parts, a server
restarted mid-upload, and the start-up check's one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.adapters.storage.s3 import S3ArtifactStore
from trainhub.core.errors import StorageUnavailable

PART = 5 << 20  # S3's smallest part
REPO = Path(__file__).resolve().parents[2]


def blob(size: int, seed: int = 0) -> bytes:
    return (bytes(range(253)) * (size // 253 + 2))[seed : seed + size]


def open_uploads(store: S3ArtifactStore) -> list[str]:
    found = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix + "/")
    return [u["Key"] for u in found.get("Uploads", [])]


def test_parts_upload_in_parallel_and_complete_whole(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=PART, concurrency=4)
    data = blob(6 * PART + 123)
    writer = store.open_writer("ckpt/a.pt")
    for at in range(0, len(data), 1 << 20):
        writer.write(data[at : at + (1 << 20)])
    assert writer.wait_sent() == 6 * PART
    assert open_uploads(store) == [f"{store.prefix}/ckpt/a.pt"]  # stored, not visible
    assert not store.exists("ckpt/a.pt")
    assert writer.commit() == len(data)
    assert writer.sent == len(data)
    assert open_uploads(store) == []
    assert b"".join(store.iter_chunks("ckpt/a.pt")) == data


UPLOADER = """
import os, sys, time
from trainhub.adapters.storage.s3 import S3ArtifactStore
url, endpoint, parts, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = (bytes(range(253)) * (total // 253 + 2))[:total]
store = S3ArtifactStore(url, endpoint_url=endpoint, part_bytes=5 << 20, concurrency=2)
writer = store.open_writer("ckpt/killed.pt")
writer.write(data[: parts * (5 << 20)])
print("STORED", writer.wait_sent(), flush=True)
time.sleep(600)  # killed here, before the commit
"""


def test_a_killed_upload_is_invisible_and_a_retry_sends_only_missing_parts(
    seaweed: SeaweedS3,
) -> None:
    store = seaweed.store(part_bytes=PART, concurrency=2)
    total = 8 * PART
    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, store.url, seaweed.endpoint, "4", str(total)],
        stdout=subprocess.PIPE,
        env={**os.environ, **seaweed.env, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert line.startswith("STORED"), line
    assert not store.exists("ckpt/killed.pt")
    assert store.list("ckpt/") == []

    data = blob(total)
    writer = store.open_writer("ckpt/killed.pt")
    for at in range(0, total, 1 << 20):
        writer.write(data[at : at + (1 << 20)])
    assert writer.commit() == total
    assert writer.sent == total - 4 * PART  # the four stored parts were not sent again
    assert store.get("ckpt/killed.pt") == data


def test_a_retry_with_other_bytes_sends_them_all(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=PART, concurrency=2)
    first = store.open_writer("ckpt/x.pt")
    first.write(blob(2 * PART, seed=1))
    first.wait_sent()  # left behind, as by a killed process
    second = store.open_writer("ckpt/x.pt")
    second.write(blob(2 * PART, seed=2))
    second.commit()
    assert second.sent == 2 * PART
    assert store.get("ckpt/x.pt") == blob(2 * PART, seed=2)


def test_an_upload_survives_a_server_restart(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=PART, concurrency=2)
    data = blob(4 * PART + 7)
    writer = store.open_writer("ckpt/restart.pt")
    writer.write(data[: 2 * PART])
    writer.wait_sent()
    seaweed.restart()
    writer.write(data[2 * PART :])
    assert writer.commit() == len(data)
    assert store.get("ckpt/restart.pt") == data


def test_bad_credentials_are_one_clear_error(seaweed: SeaweedS3) -> None:
    url = seaweed.new_url()
    saved = {k: os.environ.get(k) for k in seaweed.env}
    os.environ.update({**seaweed.env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    try:
        store = S3ArtifactStore(url, endpoint_url=seaweed.endpoint, client=None, concurrency=1)
        with pytest.raises(StorageUnavailable, match=seaweed.endpoint):
            store.check()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_a_missing_bucket_is_named(seaweed: SeaweedS3) -> None:
    store = S3ArtifactStore(
        "s3://no-such-bucket-here/p", endpoint_url=seaweed.endpoint, client=seaweed.client()
    )
    with pytest.raises(StorageUnavailable, match="no such bucket"):
        store.check()


def test_server_start_on_an_unreachable_endpoint_fails_in_one_line(tmp_path: Path) -> None:
    from tests.fixtures.control_plane import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "trainhub"),
            "server",
            "--home",
            str(tmp_path / "home"),
            "--storage",
            "s3://bucket/prefix",
            "--s3-endpoint",
            endpoint,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={
            **os.environ,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "COLUMNS": "200",
        },
        check=False,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert endpoint in out.stderr, out.stderr
    assert "s3://bucket/prefix" in out.stderr, out.stderr
    assert time.monotonic() - started < 120
