"""What a trial can reach, and what the sandbox costs, measured in the same run.

1. Escapes: a control plane with ``--sandbox bwrap`` and one with ``--sandbox none`` each run a
   victim trial and then the escape script of tests/e2e/escapes.py (admin token, database, Ray's
   session folder and token, other trials' files and processes, the trial token on another
   trial, ...). One line per attempt and mode:
   ``{"benchmark": "escape", "sandbox", "attempt", "allowed"}``.
2. Cost: ``start_ms`` is the median extra start-up time of one rank process in its sandbox
   (``python -c pass`` bare vs inside the plan a rank gets: same mounts, uid drop when root);
   ``step_overhead`` is 1 - (sandboxed / bare samples/s) of a 2-rank DDP workload
   (benchmarks/workloads/ddp_mlp.py, gloo) run alternately through the executor with and
   without the sandbox. One line ``{"benchmark": "sandbox_cost", "start_ms", "step_overhead"}``
   (targets: < 50 ms, < 1%).
3. Writes and authentication (issue 24, items 3-4): a neighbour tenant's step time alone and
   beside a disk fill past the trial's quota, a log flood, a metric flood and a flood of bad
   tokens (tests/e2e/write_workload). One line ``{"benchmark": "containment", "attacks",
   "contained", "neighbour_slowdown"}``; ``--writes-only`` runs just this part (~3 min).

Run it with a fresh home to check a fresh machine too:

    HOME=$(mktemp -d) .venv/bin/python benchmarks/isolation.py [--repeats 3] [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.escapes import SCRIPT, parse  # noqa: E402  (needs sys.path)
from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir  # noqa: E402
from tests.fixtures.ray_cluster import Watch, make_context  # noqa: E402

from trainhub.adapters import sandbox  # noqa: E402
from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402
from trainhub.adapters.ray_executor.local_cluster import read_record  # noqa: E402

WORKLOAD = REPO / "benchmarks" / "workloads"
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)


def escapes(mode: str, home: Path, address: str, code: Path) -> dict[str, bool]:
    plane_home = home / f"plane-{mode}"
    plane_home.mkdir()
    plane = ControlPlaneProcess(
        plane_home, address, settings={"sandbox": mode}, env={"CANARY_DB_PASSWORD": "hunter2"}
    )
    plane.start()
    try:
        record = read_record(home / "ray")
        assert record is not None
        assert plane.proc is not None

        def spec(name: str, other: int) -> str:
            env = {
                "ESCAPE_HOME": str(plane_home),
                "ESCAPE_DB": str(plane_home / "trainhub.db"),
                "ESCAPE_STORAGE": str(plane_home / "artifacts"),
                "ESCAPE_CHECKPOINT_ROOT": str(plane_home / "artifacts" / "trial-checkpoints"),
                "ESCAPE_WORK_ROOT": str(home / "ray" / "work"),
                "ESCAPE_RAY_TEMP": record.temp_dir,
                "ESCAPE_RAY_TOKEN_FILE": str(Path.home() / ".ray" / "auth_token"),
                "ESCAPE_RAY_USER_DIR": str(Path.home() / ".ray"),
                "ESCAPE_SERVER_PID": str(plane.proc.pid) if plane.proc else "0",
                "ESCAPE_OTHER_TRIAL": str(other),
            }
            return json.dumps(
                {
                    "name": name,
                    "entrypoint": "python escape.py",
                    "resources": {"workers": 1, "cpus_per_worker": 1},
                    "max_restarts": 0,
                    "environment": {"variables": env},
                }
            )

        victim = plane.submit(spec("victim", 0), code)["trials"][0]["id"]
        plane.wait_for(victim, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
        trial = plane.submit(spec("escaper", victim), code)["trials"][0]["id"]
        plane.wait_for(trial, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
        return {name: bool(r["allowed"]) for name, r in parse(plane.log(trial, 0)).items()}
    finally:
        plane.stop()


def start_ms(repeats: int, scratch: Path) -> float:
    """Median extra milliseconds to start one process in a rank's sandbox."""
    bwrap = sandbox.bwrap_path()
    assert bwrap is not None
    for name in ("code", "spool", "home", "checkpoints"):
        (scratch / name).mkdir(parents=True)
    mounts = [sandbox.Mount(p, p) for p in sandbox.safe_mounts(sandbox.python_paths(), [])]
    mounts += [
        sandbox.Mount(str(scratch / "code"), sandbox.CODE_DIR),
        sandbox.Mount(str(scratch / "spool"), f"{sandbox.TRIAL_ROOT}/spool", writable=True),
        sandbox.Mount(str(scratch / "home"), sandbox.HOME_DIR, writable=True),
        sandbox.Mount(str(scratch / "checkpoints"), sandbox.CHECKPOINT_DIR, writable=True),
    ]
    uid = sandbox.SANDBOX_UID_BASE if os.geteuid() == 0 else None
    plan = sandbox.SandboxPlan(tuple(mounts), sandbox.CODE_DIR, uid)
    argv = [sys.executable, "-S", "-c", "pass"]
    wrapped = sandbox.bwrap_argv(bwrap, plan, argv)

    def once(command: list[str]) -> float:
        started = time.perf_counter()
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
        return time.perf_counter() - started

    bare, boxed = [], []
    for _ in range(repeats):
        bare.append(once(argv))
        boxed.append(once(wrapped))
    return (statistics.median(boxed) - statistics.median(bare)) * 1000


def samples_per_s(mode: str, address: str, steps: int, trial_id: int) -> float:
    from trainhub.adapters.ray_executor import RayExecutor
    from trainhub.service.ports import AttemptLaunch, AttemptPhase

    executor = RayExecutor(address, namespace="isolation-bench", sandbox=mode)
    node = executor.cluster_nodes()[0].node_id
    key = f"bench-{mode}-{trial_id}"
    files = {"ddp_mlp.py": (WORKLOAD / "ddp_mlp.py").read_text()}
    executor.launch(
        AttemptLaunch(
            attempt_key=key,
            trial_id=trial_id,
            attempt=1,
            argv=("python", "ddp_mlp.py", "--steps", str(steps)),
            context_archive=make_context(files),
            env={},
            placement=(node, node),
        )
    )
    watch = Watch(executor, key)
    try:
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=600)
        assert all(r.exit_code == 0 for r in status.ranks), watch.logs
        match = RESULT.search(watch.text(0))
        assert match, watch.text(0)
        return float(json.loads(match.group(1))["samples_per_s"])
    finally:
        executor.release(key)


# -- what a trial writes and the failed-authentication limit (issue 24, items 3-4) --

WRITES = REPO / "tests" / "e2e" / "write_workload"


def _submit_write_attack(plane: ControlPlaneProcess, tenant: str, attack: str, **env: str) -> int:
    spec = {
        "name": f"{tenant}-{attack}",
        "entrypoint": "python train.py",
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "max_restarts": 0,
        "environment": {"variables": {"ATTACK": attack, **env}},
    }
    r = plane.request(
        "POST",
        "/experiments",
        data={"spec": json.dumps(spec), "tenant": tenant},
        files={"context": ("c.tar.gz", pack_dir(WRITES), "application/gzip")},
    )
    assert r.status_code == 201, r.text
    return int(r.json()["trials"][0]["id"])


def _ended(trial: dict[str, object]) -> bool:
    return trial["state"] in ("COMPLETED", "FAILED", "CANCELED")


def _step_s(plane: ControlPlaneProcess, trial_id: int) -> float:
    values = [p["values"]["step_s"] for p in plane.metrics(trial_id)]
    return statistics.median(values[3:])  # the first steps warm up


def write_containment(home: Path, address: str, steps: int) -> dict[str, object]:
    """A neighbour's step time alone, then beside a disk fill past its quota, a log flood, a
    metric flood and a flood of bad tokens; which of those were contained."""
    log_cap = 256 * 1024
    plane_home = home / "plane-writes"
    plane_home.mkdir()
    plane = ControlPlaneProcess(
        plane_home,
        address,
        settings={
            "max_log_bytes_per_trial": log_cap,
            "max_metric_points_per_minute": 2000,
            "max_metric_points_per_trial": 2500,
        },
    )
    plane.start()
    try:
        plane.request(
            "POST", "/tenants", json={"name": "hostile", "max_trial_storage_bytes": 50_000_000}
        )
        plane.request("POST", "/tenants", json={"name": "neighbour"})
        quiet = _submit_write_attack(plane, "neighbour", "steps", STEPS=str(steps))
        plane.wait_for(quiet, lambda t: t["state"] == "COMPLETED", timeout_s=300)
        quiet_s = _step_s(plane, quiet)

        beside = _submit_write_attack(plane, "neighbour", "steps", STEPS=str(steps))
        disk = _submit_write_attack(plane, "hostile", "disk")
        flood = _submit_write_attack(plane, "hostile", "log")
        points = _submit_write_attack(plane, "hostile", "metrics")
        bad = [
            httpx.get(
                f"{plane.url}/api/v1/me", headers={"Authorization": f"Bearer th_bad{i}"}
            ).status_code
            for i in range(25)
        ]
        valid = httpx.get(
            f"{plane.url}/api/v1/me", headers={"Authorization": f"Bearer {plane.token}"}
        )
        plane.wait_for(beside, lambda t: t["state"] == "COMPLETED", timeout_s=300)
        loaded_s = _step_s(plane, beside)
        stopped = plane.wait_for(disk, _ended, timeout_s=300)
        logged = plane.wait_for(flood, _ended, timeout_s=300)
        metered = plane.wait_for(points, _ended, timeout_s=300)
        text = plane.log(flood, 0)
        writes = metered["writes"]
        contained = {
            "disk_past_quota": stopped["state"] == "CANCELED"
            and any("storage quota exceeded" in e["message"] for e in stopped["events"])
            and not (plane_home / "artifacts" / "trial-checkpoints" / f"trial-{disk}").exists(),
            "log_flood": logged["state"] == "COMPLETED"
            and len(text.encode()) <= log_cap
            and text.rstrip().endswith("LAST LINE"),
            "metric_flood": writes["metric_requests_throttled"] >= 1
            and writes["metric_points"] == 2500
            and writes["metric_points_dropped"] == 500,
            "bad_token_flood": 401 in bad and valid.status_code == 200,
        }
    finally:
        plane.stop()
    return {
        "benchmark": "containment",
        "scope": "writes and authentication (issue 24, items 3-4)",
        "attacks": len(contained),
        "contained": sum(contained.values()),
        "neighbour_slowdown": round(loaded_s / quiet_s, 3),
        "neighbour_step_s": {"quiet": round(quiet_s, 4), "beside_attacks": round(loaded_s, 4)},
        "each": contained,
        "cpus": os.cpu_count(),
        "targets": {"contained": "all", "neighbour_slowdown": "<= 1.15"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--start-repeats", type=int, default=30)
    parser.add_argument(
        "--writes-only", action="store_true", help="only the write and authentication attacks"
    )
    parser.add_argument("--neighbour-steps", type=int, default=40)
    args = parser.parse_args()
    if args.writes_only:
        home = Path(tempfile.mkdtemp(prefix="trainhub-containment-"))
        try:
            address = ensure_local_ray(home / "ray", num_cpus=6)
            line = write_containment(home, address, args.neighbour_steps)
            print(json.dumps(line), flush=True)
        finally:
            stop_local_ray(home / "ray")
            shutil.rmtree(home, ignore_errors=True)
        return
    problem = sandbox.bwrap_problem()
    if problem is not None:
        sys.exit(f"no sandbox on this machine: {problem}")
    home = Path(tempfile.mkdtemp(prefix="trainhub-isolation-"))
    code = home / "code"
    code.mkdir()
    (code / "escape.py").write_text(SCRIPT)
    assert pack_dir(code)
    try:
        address = ensure_local_ray(home / "ray", num_cpus=4)
        for mode in ("bwrap", "none"):
            for attempt, allowed in sorted(escapes(mode, home, address, code).items()):
                line = {"benchmark": "escape", "sandbox": mode, "attempt": attempt}
                print(json.dumps({**line, "allowed": allowed}), flush=True)
        print(json.dumps(write_containment(home, address, args.neighbour_steps)), flush=True)
        start = start_ms(args.start_repeats, home / "start")
        samples_per_s("bwrap", address, 50, 1)  # warm both paths (imports, page cache)
        samples_per_s("none", address, 50, 2)
        rates: dict[str, list[float]] = {"bwrap": [], "none": []}
        load = [os.getloadavg()[0]]
        for repeat in range(args.repeats):
            order = ("none", "bwrap") if repeat % 2 == 0 else ("bwrap", "none")
            for mode in order:
                rates[mode].append(samples_per_s(mode, address, args.steps, 10 + repeat))
        load.append(os.getloadavg()[0])
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        stop_local_ray(home / "ray")
        shutil.rmtree(home, ignore_errors=True)
    bare, boxed = statistics.median(rates["none"]), statistics.median(rates["bwrap"])
    line = {
        "benchmark": "sandbox_cost",
        "start_ms": round(start, 1),
        "step_overhead": round(1.0 - boxed / bare, 4),
        "bare_samples_per_s": round(bare, 1),
        "sandboxed_samples_per_s": round(boxed, 1),
        "bare_runs": [round(r, 1) for r in rates["none"]],
        "sandboxed_runs": [round(r, 1) for r in rates["bwrap"]],
        "load_average_1m": [round(x, 1) for x in load],  # other work on the machine: noise
        "cpus": os.cpu_count(),
        "workload": f"MLP DDP gloo, 2 ranks, {args.steps} steps, {args.repeats} repeats",
        "targets": {"start_ms": "< 50", "step_overhead": "< 0.01"},
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
