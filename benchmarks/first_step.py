"""Submit to first optimizer step of a 2-rank trial, phase by phase, cold and warm.

Through a real control plane (its own process, ``tick_interval_s`` at the production default
of 1 s, the sandbox as ``--sandbox`` says), real Ray and real torch.distributed (gloo): a
2-rank script that imports torch and trainhub, joins the process group, builds a small DDP
model and takes one optimizer step. The phases come from the ``startup`` event the control
plane records for every attempt (trainhub.core.startup): the control plane's own marks plus
those rank 0 sends after its first step; nothing is timed by this script itself but the
wall clock of the whole run.

Both arms run in the same run on the same Ray instance, one after the other: ``cold`` with
the fast-start parts off (``warm_pool_size=0``, ``hosted_ranks=False``: an actor, a Ray worker
process, per rank and a fresh interpreter per rank), then ``warm`` with the defaults (a warm
pool of ``--pool`` per node, ranks run by the node's rank host: ADR 0028, 0031). A warm-up
trial before each arm is not counted (page cache, Ray's first worker processes, the rank
host's start). ``--sandbox`` defaults to ``auto``, what a server picks: bwrap where it works.
The pool serves sandboxed ranks where the node agent is root (ADR 0048) and unsandboxed ones
(ADR 0028); elsewhere the warm arm has the rank host only (``warm_ranks`` says how many ranks
came from the pool).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/first_step.py [--trials 20] [--cold-trials 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.control_plane import ControlPlaneProcess  # noqa: E402

from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402
from trainhub.core.startup import EVENT_KIND, PHASES, StartupPhases, parse_startup  # noqa: E402

SCRIPT = """\
import torch
import trainhub

ctx = trainhub.init()
model = ctx.prepare_model(torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(8, 32)).square().mean()
loss.backward()
optimizer.step()
ctx.report(step=0, loss=float(loss))
ctx.close()
"""
SPEC = {
    "name": "first-step",
    "entrypoint": "python train.py",
    "resources": {"workers": 2, "cpus_per_worker": 1},
    "max_restarts": 0,
}


def run_trial(plane: ControlPlaneProcess, code: Path) -> StartupPhases:
    trial_id = plane.submit(json.dumps(SPEC), code)["trials"][0]["id"]
    trial = plane.wait_for(
        trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=300, what="COMPLETED"
    )
    deadline = time.monotonic() + 10
    while True:
        found = [parse_startup(e["message"]) for e in trial["events"] if e["kind"] == EVENT_KIND]
        if found and found[0] is not None:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"trial {trial_id}: no startup event: {trial['events']}")
        time.sleep(0.2)
        trial = plane.trial(trial_id)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(runs: list[StartupPhases]) -> dict[str, Any]:
    totals = [r.total_s for r in runs if r.total_s is not None]
    phases = {
        p: round(statistics.median([r.phases[p] for r in runs if p in r.phases]), 3)
        for p in PHASES
        if any(p in r.phases for r in runs)
    }
    return {
        "p50_s": round(statistics.median(totals), 3),
        "p95_s": round(quantile(totals, 0.95), 3),
        "phases": phases,
        "warm_ranks": sum(r.warm for r in runs),
        "n": len(runs),
    }


def arm(
    home: Path, address: str, code: Path, size: int, trials: int, sandbox: str
) -> dict[str, Any]:
    plane_home = home / f"plane-{size}"
    plane_home.mkdir()
    settings = {"sandbox": sandbox, "tick_interval_s": 1.0, "warm_pool_size": size}
    plane = ControlPlaneProcess(
        plane_home, address, settings={**settings, "hosted_ranks": size > 0}
    )
    plane.start()
    try:
        run_trial(plane, code)  # warm-up: not counted
        return summary([run_trial(plane, code) for _ in range(trials)])
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20, help="warm trials")
    parser.add_argument("--cold-trials", type=int, default=10)
    parser.add_argument("--pool", type=int, default=2, help="warm pool size per node")
    parser.add_argument(
        "--sandbox",
        default="auto",
        help="auto (default: bwrap where it works, as a server picks) | bwrap | none",
    )
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trainhub-first-step-"))
    code = home / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    began = time.monotonic()
    try:
        address = ensure_local_ray(home / "ray", num_cpus=4)
        cold = arm(home, address, code, 0, args.cold_trials, args.sandbox)
        warm = arm(home, address, code, args.pool, args.trials, args.sandbox)
    finally:
        stop_local_ray(home / "ray")
        shutil.rmtree(home, ignore_errors=True)
    line = {
        "benchmark": "first_step",
        "p50_s": warm["p50_s"],
        "p95_s": warm["p95_s"],
        "phases": warm["phases"],
        "vs_cold": round(warm["p50_s"] / cold["p50_s"], 3),
        "cold": cold,
        "warm": warm,
        "sandbox": args.sandbox,
        "pool": args.pool,
        "wall_s": round(time.monotonic() - began, 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "targets": {"p50_s": "< 2.0", "p95_s": "< 4"},
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
