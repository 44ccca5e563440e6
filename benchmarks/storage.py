"""A large checkpoint's round trip through the control plane, and the memory it costs it.

A trial's rank (a separate process running the trainhub runtime, as the executor would start
it) saves a ``--checkpoint-gb`` checkpoint with ``ctx.save_checkpoint``; a second attempt's
rank restores it with ``ctx.restore()``; then a user downloads it with the Python client
(``TrainhubClient.save_checkpoint_file``). The control plane's API runs in its own process
(benchmarks/api_server.py); its resident memory is sampled every 5 ms through all three.
Prints one JSON line: ``{"benchmark": "storage", "checkpoint_gb", "peak_rss_growth_mb", ...}``
(target: < 100 MB of growth for 2 GB). Needs about 4x the checkpoint in free disk space.
Before it, the ``s3_checkpoint``, ``s3_resume`` and ``s3_routes`` lines of
benchmarks/storage_s3.py.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/storage.py [--checkpoint-gb 2] [--only api|s3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "src"))

from abuse import CONTEXT, PeakRss  # noqa: E402  (needs sys.path)
from api_server import ApiServer, start_attempt  # noqa: E402

# what a rank runs: save (attempt 1) or restore and check (attempt 2)
RANK = """
import os, sys, time, torch, trainhub
size = int(sys.argv[2])
ctx = trainhub.init()
started = time.monotonic()
if sys.argv[1] == "save":
    state = {"weights": torch.ones(size, dtype=torch.uint8), "step": 7}
    ctx.save_checkpoint(state, step=7)
    del state
    assert ctx.close(timeout_s=1800)
else:
    state = ctx.restore()
    assert state is not None and state["step"] == 7
    weights = state["weights"]
    assert weights.numel() == size and int(weights[-1]) == 1
    ctx.close(timeout_s=60)
print("SECONDS", time.monotonic() - started)
"""


def run_rank(server: ApiServer, home: Path, mode: str, size: int, env: dict[str, str]) -> float:
    spool = home / f"spool-{mode}"
    spool.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", RANK, mode, str(size)],
        env={
            **os.environ,
            "PYTHONPATH": str(REPO / "src"),
            "TRAINHUB_API_URL": server.url,
            "TRAINHUB_SPOOL_DIR": str(spool),
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"rank ({mode}) failed:\n{out.stdout}\n{out.stderr}")
    return float(out.stdout.split("SECONDS")[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-gb", type=float, default=2.0)
    parser.add_argument(
        "--only",
        choices=["api", "s3"],
        help="one part: the control plane's round trip (api) or a bucket's (s3, storage_s3.py)",
    )
    args = parser.parse_args()
    if args.only != "api":
        from storage_s3 import run as run_s3

        run_s3(args.checkpoint_gb)
        if args.only == "s3":
            return
    size = int(args.checkpoint_gb * 1e9)
    with (
        tempfile.TemporaryDirectory(prefix="trainhub-storage-") as tmp,
        ApiServer(Path(tmp)) as server,
    ):
        home = Path(tmp)
        admin = {"Authorization": f"Bearer {server.token}"}
        http = httpx.Client(base_url=server.url + "/api/v1", headers=admin, timeout=60)
        files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
        spec = "name: big\nentrypoint: python train.py\n"
        trial_id = http.post("/experiments", data={"spec": spec}, files=files).json()["trials"][0][
            "id"
        ]
        token = start_attempt(server.db_url, trial_id)
        env = {
            "TRAINHUB_TOKEN": token,
            "TRAINHUB_TRIAL_ID": str(trial_id),
            "TRAINHUB_ATTEMPT": "1",
        }
        baseline = server.rss_mb()
        peak = PeakRss(server)
        save_s = run_rank(server, home, "save", size, env)
        (checkpoint,) = http.get(f"/trials/{trial_id}/checkpoints").json()["data"]
        restore_env = {**env, "TRAINHUB_RESTORE_CHECKPOINT": str(checkpoint["id"])}
        restore_s = run_rank(server, home, "restore", size, restore_env)
        from trainhub.client import TrainhubClient

        started = time.monotonic()
        with TrainhubClient(server.url, server.token, timeout_s=600) as client:
            downloaded = client.save_checkpoint_file(
                trial_id, checkpoint["id"], home / "download.pt"
            )
        download_s = time.monotonic() - started
        top = peak.stop()
        assert downloaded == checkpoint["size_bytes"]
        print(
            json.dumps(
                {
                    "benchmark": "storage",
                    "checkpoint_gb": round(checkpoint["size_bytes"] / 1e9, 3),
                    "peak_rss_growth_mb": round(top - baseline, 1),
                    "baseline_rss_mb": round(baseline, 1),
                    "save_s": round(save_s, 2),
                    "restore_s": round(restore_s, 2),
                    "download_s": round(download_s, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
