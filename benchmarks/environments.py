"""What a trial environment costs: its cold build, and a cached one's start against the base.

Through a real control plane (its own process, sandbox as ``--sandbox auto`` resolves here),
real Ray, real uv and the package index this machine reaches:

1. a trial whose spec asks for ``--packages`` (small pure-Python packages the base lacks) is
   submitted on an empty environment cache and an empty uv cache (run it with a fresh HOME):
   ``cold_build_s`` is the environment's build time as its record says (resolve + venv +
   install), ``cold_submit_to_first_step_s`` the trial's whole wait;
2. then, alternately, the same trial on the cached environment and on the base environment
   (the same script, the same spec but for its ``environment``), ``--repeats`` each:
   ``warm_start_overhead_ms`` is the difference of the medians of submit-to-first-step, and
   ``second_trial_start_vs_base`` their ratio (target <= 1.10).

The script imports its packages only in the cold trial (it checks the environment works);
in the timed trials it runs the same code on both, so the difference is the platform's.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/environments.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

PACKAGES = ["inflection==0.5.1", "humanize==4.9.0", "tabulate==0.9.0"]
FIRST_STEP = re.compile(r"^FIRST_STEP (\d+\.\d+)$", re.M)
SCRIPT = """\
import importlib
import os
import time

import trainhub

for name in filter(None, os.environ.get("IMPORTS", "").split(",")):
    importlib.import_module(name)
ctx = trainhub.init()
ctx.report(step=0, loss=1.0)
print("FIRST_STEP", f"{time.time():.6f}", flush=True)
"""


def spec(name: str, packages: list[str], imports: str = "") -> str:
    body: dict[str, Any] = {
        "name": name,
        "entrypoint": "python train.py",
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "max_restarts": 0,
        "environment": {"variables": {"IMPORTS": imports}},
    }
    if packages:
        body["environment"]["packages"] = packages
    return json.dumps(body)


def run_trial(plane: ControlPlaneProcess, code: Path, text: str) -> tuple[int, float]:
    """Submit, wait for the end; the trial id and seconds from submit to its first step."""
    submitted = time.time()
    trial_id = plane.submit(text, code)["trials"][0]["id"]
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=600, what="COMPLETED")
    log = plane.log(trial_id, 0)
    match = FIRST_STEP.search(log)
    assert match, log
    return trial_id, float(match.group(1)) - submitted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trainhub-envs-bench-"))
    code = home / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    plane_home = home / "plane"
    plane_home.mkdir()
    plane: ControlPlaneProcess | None = None
    try:
        address = ensure_local_ray(home / "ray", num_cpus=2)
        plane = ControlPlaneProcess(plane_home, address, settings={"sandbox": "auto"})
        plane.start()
        imports = ",".join(p.split("==")[0] for p in PACKAGES)
        _, cold = run_trial(plane, code, spec("cold", PACKAGES, imports))
        (record,) = plane.request("GET", "/environments").json()["data"]
        run_trial(plane, code, spec("warm-up", []))  # both paths warm (page cache, imports)
        base: list[float] = []
        cached: list[float] = []
        for repeat in range(args.repeats):
            order = ("base", "env") if repeat % 2 == 0 else ("env", "base")
            for which in order:
                if which == "base":
                    base.append(run_trial(plane, code, spec("base", []))[1])
                else:
                    cached.append(run_trial(plane, code, spec("env", PACKAGES))[1])
        (after,) = plane.request("GET", "/environments").json()["data"]
        assert after["num_builds"] == 1, after  # every timed trial reused the first build
    finally:
        if plane is not None:
            plane.stop()
        stop_local_ray(home / "ray")
        shutil.rmtree(home, ignore_errors=True)
    base_s, env_s = statistics.median(base), statistics.median(cached)
    line = {
        "benchmark": "environment",
        "packages": len(PACKAGES),
        "cold_build_s": round(record["build_s"], 2),
        "warm_start_overhead_ms": round((env_s - base_s) * 1000, 1),
        "second_trial_start_vs_base": round(env_s / base_s, 3),
        "cold_submit_to_first_step_s": round(cold, 2),
        "base_submit_to_first_step_s": round(base_s, 3),
        "cached_submit_to_first_step_s": round(env_s, 3),
        "base_runs_s": [round(x, 3) for x in base],
        "cached_runs_s": [round(x, 3) for x in cached],
        "env_size_mb": round(record["size_bytes"] / 1e6, 2),
        "uses": after["num_uses"],
        "load_average_1m": round(os.getloadavg()[0], 1),
        "targets": {"second_trial_start_vs_base": "<= 1.10"},
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
