"""Pushing a 1 GB dataset through a real control plane, and what a second trial on the node
pays for it.

A fresh control plane process (its own home, a local Ray head, bwrap where it works) receives
``--gb`` of dataset files through ``trainhub.client.datasets.push_dataset`` (a hashing pass
over the files, then the streamed upload); its resident memory is sampled every 5 ms from
before the push until the second trial ends (the upload, and both trials' nodes fetching it).
Then two trials that mount the dataset run one after the other on the one node: the first
fetches and extracts it into the node's cache, the second finds it there. Its wait is read
from the cache's record (``last_ready_s``), with the bytes it copied (0).

Prints one JSON line: ``{"benchmark": "dataset", "gb", "push_mib_s", "second_trial_copy_s",
"peak_rss_growth_mb", ...}`` (targets: growth < 64 MB, second trial < 0.5 s). Needs about 4x
``--gb`` of free disk.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/datasets.py [--gb 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir  # noqa: E402

from trainhub.adapters.dataset_cache import DatasetCache  # noqa: E402
from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402
from trainhub.adapters.sandbox import bwrap_problem  # noqa: E402
from trainhub.client import TrainhubClient  # noqa: E402
from trainhub.client.datasets import plan_archive, push_dataset  # noqa: E402

MIB = 1 << 20
FILE_BYTES = 64 * MIB
READER = """
import os, sys
total = sum(os.path.getsize(os.path.join("/data/big", n)) for n in os.listdir("/data/big"))
print("BYTES", total, flush=True)
"""


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / MIB


def make_files(folder: Path, size: int) -> None:
    folder.mkdir(parents=True)
    block = bytearray(range(256)) * (MIB // 256)
    index = 0
    while size > 0:
        part = min(size, FILE_BYTES)
        with (folder / f"part-{index:03d}.bin").open("wb") as handle:
            for offset in range(0, part, MIB):
                block[:8] = (index * 10**6 + offset).to_bytes(8, "little")  # no two alike
                handle.write(block[: min(MIB, part - offset)])
        size -= part
        index += 1


def run_trial(plane: ControlPlaneProcess, code: Path, name: str) -> str:
    spec = {
        "name": name,
        "entrypoint": "python reader.py",
        "max_restarts": 0,
        "data": [{"name": "big", "mount": "/data/big"}],
    }
    r = httpx.post(
        f"{plane.url}/api/v1/experiments",
        data={"spec": json.dumps(spec)},
        files={"context": ("c.tar.gz", pack_dir(code), "application/gzip")},
        headers={"Authorization": f"Bearer {plane.token}"},
        timeout=60,
    )
    r.raise_for_status()
    trial_id = r.json()["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=600, what="done")
    return plane.log(trial_id, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0)
    args = parser.parse_args()
    size = int(args.gb * 1e9)
    scratch = Path(tempfile.mkdtemp(prefix="trainhub-bench-datasets-"))
    home = scratch / "home"
    home.mkdir()
    cache = scratch / "node-cache"
    address = ensure_local_ray(home / "ray", num_cpus=2)
    sandbox = "bwrap" if bwrap_problem() is None else "none"
    plane = ControlPlaneProcess(
        home, address, settings={"sandbox": sandbox, "dataset_cache_dir": str(cache)}
    )
    try:
        make_files(scratch / "big", size)
        code = scratch / "code"
        code.mkdir()
        (code / "reader.py").write_text(READER)
        plane.start()
        assert plane.proc is not None
        rss = PeakRss(plane.proc.pid)
        started = time.monotonic()
        plan = plan_archive(scratch / "big")
        hashed = time.monotonic()
        with TrainhubClient(plane.url, plane.token, timeout_s=600) as client:
            pushed = push_dataset(client, "big", scratch / "big", plan=plan)
        pushed_at = time.monotonic()
        assert pushed["stored_bytes"] == plan.size_bytes
        first_log = run_trial(plane, code, "first")
        first = DatasetCache(cache).record(plan.sha256)
        second_log = run_trial(plane, code, "second")
        growth_mb = rss.stop()
        second = DatasetCache(cache).record(plan.sha256)
        assert first is not None
        assert second is not None
        assert f"BYTES {size}" in second_log, second_log
        assert "node cache hit, copied nothing" in second_log, second_log
        line = {
            "benchmark": "dataset",
            "gb": args.gb,
            "push_mib_s": round(plan.size_bytes / MIB / (pushed_at - started), 1),
            "upload_mib_s": round(plan.size_bytes / MIB / (pushed_at - hashed), 1),
            "hash_pass_s": round(hashed - started, 2),
            "first_trial_fetch_s": round(first.last_ready_s, 3),
            "second_trial_copy_s": round(second.last_ready_s, 4),
            "node_fetches": second.fetches,
            "cache_hits": second.hits,
            "peak_rss_growth_mb": round(growth_mb, 1),
            "sandbox": sandbox,
            "targets": {"peak_rss_growth_mb": "< 64", "second_trial_copy_s": "< 0.5"},
        }
        assert "fetched" in first_log, first_log
        print(json.dumps(line), flush=True)
    finally:
        plane.stop()
        stop_local_ray(home / "ray")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
