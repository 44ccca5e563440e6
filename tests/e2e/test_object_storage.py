"""End to end: a control plane whose only storage is an S3 bucket (SeaweedFS), no shared folder.

A real server (``storage_url=s3://...``, as ``trainhub server --storage s3://BUCKET/PREFIX
--s3-endpoint URL``) on the session's Ray head runs a trial that checkpoints, fails on
purpose, is restarted and restores its checkpoint from the bucket. Its code archive, logs and
checkpoints are objects in the bucket; the server's home holds none of them; the rank never
sees the bucket's credentials. The S3 server killed and restarted in the middle of a trial:
its later checkpoints land, every registered one is whole, the control plane lives on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess
from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.adapters.storage.s3 import S3ArtifactStore

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
    request: pytest.FixtureRequest, ray_address: str, tmp_path: Path, seaweed: SeaweedS3
) -> Iterator[tuple[ControlPlaneProcess, str]]:
    """The server on a bucket; ``request.param`` (indirect): its ``--rank-storage``."""
    home = tmp_path / "home"
    home.mkdir()
    url = seaweed.new_url("cluster-a")
    route = getattr(request, "param", "control-plane")
    plane = ControlPlaneProcess(
        home,
        ray_address,
        settings={"storage_url": url, "s3_endpoint": seaweed.endpoint, "rank_storage": route},
        env=seaweed.env,
    )
    plane.start()
    try:
        yield plane, url
    finally:
        plane.stop()


# direct: the rank moves its checkpoints with presigned URLs (or, where its network reaches
# only the control plane, falls back to the control plane's route): the same outcome
@pytest.mark.parametrize("s3_plane", ["control-plane", "direct"], indirect=True)
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
    # logs are segment objects beside the prefix (s3_segments.py), one blob each to the store
    store = S3ArtifactStore(url, endpoint_url=seaweed.endpoint, client=seaweed.client())
    logs = {b.key: b.size for b in store.list("tenants/default/logs/")}
    for attempt in (1, 2):
        log = f"tenants/default/logs/trial-{trial_id}/attempt-{attempt}/rank-0.log"
        assert logs.get(log, 0) > 0, logs
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


STEADY = """\
import time
import trainhub

ctx = trainhub.init()
state = ctx.restore()
start = 0 if state is None else state["step"] + 1
for step in range(start, 16):
    ctx.report(step=step, loss=1.0 / (step + 1))
    ctx.save_checkpoint({"step": step, "weights": bytes(1_000_000)}, step=step)
    print(f"saved step {step}", flush=True)
    time.sleep(1.0)
ctx.close(timeout_s=120)
"""


def test_the_s3_server_restarting_mid_trial_loses_nothing_visible(
    s3_plane: tuple[ControlPlaneProcess, str], seaweed: SeaweedS3, tmp_path: Path
) -> None:
    plane, url = s3_plane
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(STEADY)
    spec = SPEC.replace("s3-restore", "s3-outage").replace("max_restarts: 1", "max_restarts: 3")
    trial_id = plane.submit(spec, context)["trials"][0]["id"]
    plane.wait_for(
        trial_id,
        lambda t: len(t["checkpoints"]) >= 2,
        timeout_s=180,
        what="checkpointing",
    )
    seaweed.kill()
    time.sleep(4)
    seaweed.start()
    trial = plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=300, what="COMPLETED"
    )
    assert plane.proc is not None
    assert plane.proc.poll() is None  # the control plane lived
    # every registered checkpoint is whole in the bucket; later ones landed after the restart
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = seaweed.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    sizes = {o["Key"].rsplit("/", 1)[-1]: o["Size"] for o in listed.get("Contents", [])}
    kept = plane.request("GET", f"/trials/{trial_id}/checkpoints").json()["data"]
    assert kept
    assert max(c["step"] for c in kept) == 15
    for checkpoint in kept:
        assert sizes[f"{checkpoint['uuid']}.ckpt"] == checkpoint["size_bytes"]
    assert trial["latest_metrics"]["step"] == 15
