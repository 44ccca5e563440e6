"""Overhead of running through trainhub vs bare torchrun, measured in the same run.

The same plain DDP script (benchmarks/workloads/ddp_mlp.py, 2 processes, gloo) runs
alternately bare (`torchrun --standalone --nproc-per-node 2`) and as a 2-worker trainhub trial
(control plane + Ray already running). Prints one JSON line:
- throughput_ratio: median trainhub samples/s / median bare samples/s (target >= 0.95);
- submit_to_first_step_s: median seconds from the submit request to the first training step of
  rank 0 (target < 3 s), also its max; beside it the same script's launch-to-first-step under
  bare torchrun, and the difference (what trainhub adds: scheduling, placement, actor start).

    .venv/bin/python benchmarks/overhead.py [--repeats 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.control_plane import ControlPlaneProcess  # noqa: E402  (needs sys.path)

from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402

WORKLOAD = REPO / "benchmarks" / "workloads"
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)


def bare(steps: int) -> dict[str, float]:
    torchrun = Path(sys.executable).parent / "torchrun"
    launched = time.time()
    out = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "ddp_mlp.py",
            "--steps",
            str(steps),
        ],
        cwd=WORKLOAD,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = RESULT.search(out)
    assert match, out
    result = dict(json.loads(match.group(1)))
    result["launch_to_first_step_s"] = result["first_step_unix"] - launched
    return result


def through_trainhub(plane: ControlPlaneProcess, steps: int) -> tuple[dict[str, float], float]:
    spec = (
        "name: overhead\nentrypoint: python ddp_mlp.py --steps "
        f"{steps}\nresources: {{workers: 2, cpus_per_worker: 1}}\nmax_restarts: 0\n"
    )
    submitted = time.time()
    experiment = plane.submit(spec, WORKLOAD)
    trial_id = experiment["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=600, what="COMPLETED")
    text = plane.log(trial_id, 0)
    match = RESULT.search(text)
    assert match, text
    result = dict(json.loads(match.group(1)))
    return result, result["first_step_unix"] - submitted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trainhub-bench-"))
    try:
        address = ensure_local_ray(home / "ray", num_cpus=4)
        # the production tick (1 s): the control loop's polling shares the cores with the ranks
        plane = ControlPlaneProcess(home, address, settings={"tick_interval_s": 1.0})
        plane.start()
        try:
            # warm both paths once (imports, page cache) so neither pays a cold start
            bare(50)
            through_trainhub(plane, 50)
            bare_rates, hub_rates, latencies, bare_latencies = [], [], [], []
            for _ in range(args.repeats):
                result = bare(args.steps)
                bare_rates.append(result["samples_per_s"])
                bare_latencies.append(result["launch_to_first_step_s"])
                result, latency = through_trainhub(plane, args.steps)
                hub_rates.append(result["samples_per_s"])
                latencies.append(latency)
        finally:
            plane.stop()
    finally:
        stop_local_ray(home / "ray")
        shutil.rmtree(home, ignore_errors=True)
    line = {
        "benchmark": "overhead",
        "workload": f"MLP 784-512-512-10 DDP gloo, 2 ranks, batch 64/rank, {args.steps} steps",
        "repeats": args.repeats,
        "bare_samples_per_s": round(statistics.median(bare_rates), 1),
        "trainhub_samples_per_s": round(statistics.median(hub_rates), 1),
        "throughput_ratio": round(statistics.median(hub_rates) / statistics.median(bare_rates), 3),
        "submit_to_first_step_s": round(statistics.median(latencies), 2),
        "submit_to_first_step_max_s": round(max(latencies), 2),
        # the same script started by torchrun directly: torch import, process group, DDP
        "bare_launch_to_first_step_s": round(statistics.median(bare_latencies), 2),
        "trainhub_added_latency_s": round(
            statistics.median(latencies) - statistics.median(bare_latencies), 2
        ),
        "targets": {"throughput_ratio": ">= 0.95", "submit_to_first_step_s": "< 3"},
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
