"""End to end: a control plane whose only storage is an S3 bucket (SeaweedFS), no shared folder.

A real server (``storage_url=s3://...``, as ``trainhub server --storage s3://BUCKET/PREFIX
--s3-endpoint URL``) on the session's Ray head runs a trial that checkpoints, fails on
purpose, is restarted and restores its checkpoint from the bucket. Its code archive, logs and
checkpoints are objects in the bucket; the server's home holds none of them; the rank never
sees the bucket's credentials.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess
from tests.fixtures.seaweedfs import SeaweedS3

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

TRAIN = """\
import os, sys
import trainhub

leaked = sorted(k for k in os.environ if k.startswith("AWS_"))
assert not leaked, f"bucket credentials reached the rank: {leaked}"
ctx = trainhub.init()
state = ctx.restore()
start = 0 if state is None else state["step"] + 1
print(f"resumed at step {start}" if state else "fresh start", flush=True)
for step in range(start, 6):
    ctx.report(step=step, loss=1.0 / (step + 1))
    # 6 MB: more than one part of a multipart upload
    ctx.save_checkpoint({"step": step, "weights": bytes(6_000_000)}, step=step)
    if state is None and step == 2:
        ctx.close(timeout_s=120)
        print("failing on purpose after step 2", flush=True)
        sys.exit(3)
ctx.close(timeout_s=120)
print("done", flush=True)
"""

SPEC = """\
name: s3-restore
entrypoint: python train.py
resources: {workers: 1, cpus_per_worker: 1}
checkpoints: {keep_latest: 2}
max_restarts: 1
"""


@pytest.fixture
def s3_plane(
    ray_address: str, tmp_path: Path, seaweed: SeaweedS3
) -> Iterator[tuple[ControlPlaneProcess, str]]:
    home = tmp_path / "home"
    home.mkdir()
    url = f"s3://{seaweed.new_bucket()}/cluster-a"
    plane = ControlPlaneProcess(
        home,
        ray_address,
        settings={"storage_url": url, "s3_endpoint": seaweed.endpoint},
        env=seaweed.env,
    )
    plane.start()
    try:
        yield plane, url
    finally:
        plane.stop()


def test_a_trial_checkpoints_restarts_and_restores_from_the_bucket(
    s3_plane: tuple[ControlPlaneProcess, str], seaweed: SeaweedS3, tmp_path: Path
) -> None:
    plane, url = s3_plane
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(TRAIN)
    experiment = plane.submit(SPEC, context)
    trial_id = experiment["trials"][0]["id"]
    trial = plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=300, what="COMPLETED"
    )
    assert trial["num_attempts"] == 2
    first, second = trial["attempts"]
    assert first["outcome"] == "FAILED"
    assert second["restored_checkpoint_id"] is not None
    assert "resumed at step 3" in plane.log(trial_id, 0, attempt=2)
    assert "failing on purpose" in plane.log(trial_id, 0, attempt=1)
    assert [p["step"] for p in plane.metrics(trial_id)] == list(range(6))

    # everything lives in the bucket ...
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = seaweed.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    keys = {o["Key"]: o["Size"] for o in listed.get("Contents", [])}
    tenant = f"{prefix}/tenants/default"
    assert any(k.startswith(f"{tenant}/contexts/") for k in keys), keys
    for attempt in (1, 2):
        log = f"{tenant}/logs/trial-{trial_id}/attempt-{attempt}/rank-0.log"
        assert keys.get(log, 0) > 0, keys
    stored = sorted(k for k in keys if k.startswith(f"{tenant}/checkpoints/trial-{trial_id}/"))
    assert len(stored) == 2  # keep_latest: 2, retention deletes from the bucket too
    # ... counted as the bucket holds them (the bytes quotas and retention use)
    kept = plane.request("GET", f"/trials/{trial_id}/checkpoints").json()["data"]
    by_uuid = {k.rsplit("/", 1)[-1].removesuffix(".ckpt"): size for k, size in keys.items()}
    assert {c["uuid"]: c["size_bytes"] for c in kept} == {
        k.rsplit("/", 1)[-1].removesuffix(".ckpt"): keys[k] for k in stored
    }
    assert all(by_uuid[c["uuid"]] == c["size_bytes"] > 6_000_000 for c in kept)
    # ... and none of it in the server's home
    artifacts = plane.home / "artifacts"
    assert not artifacts.exists() or not any(p.is_file() for p in artifacts.rglob("*"))
