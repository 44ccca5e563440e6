"""A hostile tenant's writes are contained, and its neighbour does not notice (issue 24).

One real control plane (its own process, the session's Ray head, the sandbox where bwrap
works) runs three hostile trials of tenant ``hostile`` and a quiet one of tenant
``neighbour`` at the same time (tests/e2e/write_workload/train.py):

- 80 MiB written straight into the checkpoint folder and home, past a 50 MB trial quota:
  the runtime raises QuotaExceeded with the numbers, the trial is stopped with the reason,
  and its folder is removed when it ends;
- a 3 MB log past a 256 KiB cap: the stored log keeps its first lines, a marker with the
  dropped count, and its last line;
- 3,000 metric points against 2,000 a minute and 2,500 in all: 429 with Retry-After, the
  runtime waits and sends again (nothing lost under the caps), 500 dropped and counted,
  shown with the trial;
- the neighbour completes with its 20 points.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKLOAD = Path(__file__).parent / "write_workload"
LOG_CAP = 256 * 1024
TRIAL_QUOTA = 50_000_000


def spec(name: str, attack: str) -> str:
    return json.dumps(
        {
            "name": name,
            "entrypoint": "python train.py",
            "resources": {"workers": 1, "cpus_per_worker": 1},
            "max_restarts": 0,
            "environment": {"variables": {"ATTACK": attack}},
        }
    )


def submit(plane: ControlPlaneProcess, tenant: str, name: str, attack: str) -> int:
    from tests.fixtures.control_plane import pack_dir

    r = plane.request(
        "POST",
        "/experiments",
        data={"spec": spec(name, attack), "tenant": tenant},
        files={"context": ("context.tar.gz", pack_dir(WORKLOAD), "application/gzip")},
    )
    assert r.status_code == 201, r.text
    return int(r.json()["trials"][0]["id"])


def ended(trial: dict[str, Any]) -> bool:
    return trial["state"] in ("COMPLETED", "FAILED", "CANCELED")


@pytest.fixture
def plane(ray_address: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlaneProcess(
        home,
        ray_address,
        settings={
            "max_log_bytes_per_trial": LOG_CAP,
            "max_metric_points_per_minute": 2000,
            "max_metric_points_per_trial": 2500,
        },
    )
    plane.start()
    try:
        r = plane.request(
            "POST", "/tenants", json={"name": "hostile", "max_trial_storage_bytes": TRIAL_QUOTA}
        )
        assert r.status_code == 201, r.text
        assert plane.request("POST", "/tenants", json={"name": "neighbour"}).status_code == 201
        yield plane
    finally:
        for experiment in plane.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        time.sleep(2)
        plane.stop()


def test_a_hostile_tenant_is_contained_in_what_it_writes(plane: ControlPlaneProcess) -> None:
    disk = submit(plane, "hostile", "fill-disk", "disk")
    flood = submit(plane, "hostile", "flood-log", "log")
    points = submit(plane, "hostile", "flood-metrics", "metrics")
    quiet = submit(plane, "neighbour", "quiet", "quiet")

    # the neighbour: unaffected
    done = plane.wait_for(quiet, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    assert [p["step"] for p in plane.metrics(quiet)] == list(range(20))
    assert done["writes"]["metric_points_dropped"] == 0

    # the disk: stopped with the numbers, the runtime told, the folder gone at the end
    stopped = plane.wait_for(disk, ended, timeout_s=240, what="ended")
    reasons = " ".join(e["message"] for e in stopped["events"])
    assert stopped["state"] == "CANCELED", stopped
    assert "storage quota exceeded" in reasons, reasons
    assert "its quota is 0.05 GiB" in reasons, reasons
    log = plane.log(disk, 0)
    assert "WROTE 80 MiB" in log
    assert "QUOTA " in log, log[-3000:]
    assert "into its checkpoint folder, home and scratch" in log
    folder = plane.home / "artifacts" / "trial-checkpoints" / f"trial-{disk}"
    # removed right after the end is committed (the loop writes the state, then discards the
    # files): the test can read CANCELED a moment before the folder goes
    deadline = time.monotonic() + 60
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not folder.exists()
    assert plane.trial(disk)["writes"]["disk_bytes"] == 0

    # the log: its head, a marker with the dropped count, its last line
    plane.wait_for(flood, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    text = plane.log(flood, 0)
    assert len(text.encode()) <= LOG_CAP
    assert "line 0000000" in text
    assert "bytes of output dropped here (log cap: 262144 bytes per rank)" in text
    assert text.rstrip().endswith("LAST LINE"), text[-500:]
    dropped = int(text.split("[trainhub] ... ")[1].split(" ")[0])
    assert dropped > 2_500_000

    # the metrics: throttled, resent, capped in all, and all of it visible
    done = plane.wait_for(points, ended, timeout_s=300, what="ended")
    assert done["state"] == "COMPLETED", done
    writes = done["writes"]
    assert writes["metric_points"] == 2500
    assert writes["metric_points_dropped"] == 500
    assert writes["metric_requests_throttled"] >= 1
    assert writes["max_metric_points_per_minute"] == 2000
    steps = [p["step"] for p in plane.metrics(points)]
    assert steps == list(range(2500))  # nothing lost under the caps
    assert "DELIVERED" in plane.log(points, 0)
