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

3. Containment (issue 24): ``sandbox_cost`` again, of a *contained* rank: its cgroup, the
   trial's network namespace, the seccomp filter and the sized tmpfs on top of the sandbox.
   ``start_ms`` is the median extra time to make all of it, start ``python -c pass`` in it and
   remove it, against a bare start (target < 100 ms); ``step_overhead`` is the relative extra
   CPU time per step of rank 0 of the DDP workload, contained vs bare (target < 2%), with each
   run's value as the spread. Then ``containment``: a neighbour tenant's two-rank trial runs
   alone, then while another tenant's trials attack (tests/e2e/escapes.py ATTACKS, ALLOCATE,
   BUSY), then alone again; ``attacks`` counts the attacks, ``contained`` those that failed as
   they must, and ``neighbour_slowdown`` is the neighbour's median step time during the
   attacks over its median step time before and after them (target <= 1.15).

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

from tests.e2e.escapes import (  # noqa: E402  (needs sys.path)
    ALLOCATE,
    ATTACKS,
    BUSY,
    NEIGHBOUR,
    SCRIPT,
    parse,
)
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
    return float(ddp_result(mode, address, steps, trial_id)["samples_per_s"])


def ddp_result(
    mode: str, address: str, steps: int, trial_id: int, contained: bool = False
) -> dict[str, float]:
    """Rank 0's RESULT of the DDP workload through the executor (``contained``: a profile)."""
    from trainhub.adapters.ray_executor import RayExecutor
    from trainhub.core.isolation import NodeIsolation
    from trainhub.service.ports import AttemptLaunch, AttemptPhase

    executor = RayExecutor(
        address,
        namespace="isolation-bench",
        sandbox=mode,
        isolation=NodeIsolation() if contained else None,
    )
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
        return dict(json.loads(match.group(1)))
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


def contained_start_ms(repeats: int, scratch: Path) -> tuple[list[float], list[float]]:
    """Extra milliseconds of each contained start (cgroup, network, filter made; the process
    run to its end) over the bare start next to it, and the milliseconds of each removal."""
    from trainhub.adapters.ray_executor.containment import Containment
    from trainhub.core.isolation import NodeIsolation, TrialResources

    bwrap = sandbox.bwrap_path()
    assert bwrap is not None
    mounts = [sandbox.Mount(p, p) for p in sandbox.safe_mounts(sandbox.python_paths(), [])]
    uid = sandbox.SANDBOX_UID_BASE if os.geteuid() == 0 else None
    plan = sandbox.SandboxPlan(tuple(mounts), "/", uid)
    argv = [sys.executable, "-S", "-c", "pass"]
    resources = TrialResources(cpus_per_worker=1, memory_gb_per_worker=1)
    extra, removals = [], []
    for index in range(repeats):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        bare = time.perf_counter() - started
        started = time.perf_counter()
        env = {"TRAINHUB_API_URL": "http://127.0.0.1:9"}
        contained = Containment.prepare(
            f"bench-{os.getpid()}-{index}",
            f"bench-{os.getpid()}-{index}",
            0,
            resources,
            NodeIsolation(),
            num_nodes=1,
            env=env,
        )
        subprocess.run(
            sandbox.bwrap_argv(bwrap, contained.sandbox_plan(plan), argv),
            check=True,
            stdin=subprocess.DEVNULL,
            preexec_fn=contained.enter,
            pass_fds=contained.pass_fds(),
        )
        ran = time.perf_counter()
        contained.remove(last_on_node=True)
        removals.append((time.perf_counter() - ran) * 1000)
        extra.append((ran - started - bare) * 1000)
    return extra, removals


def contained_cost(args: argparse.Namespace, address: str, scratch: Path) -> dict[str, object]:
    """The ``sandbox_cost`` line of a contained rank (netns, cgroup, seccomp, sized tmpfs)."""
    starts, removals = contained_start_ms(args.start_repeats, scratch)
    ddp_result("bwrap", address, 50, 101, contained=True)  # warm both paths
    ddp_result("none", address, 50, 102)
    cpu: dict[str, list[float]] = {"contained": [], "bare": []}
    load = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for contained in order:
            mode = "bwrap" if contained else "none"
            result = ddp_result(mode, address, args.steps, 110 + 2 * repeat + contained, contained)
            cpu["contained" if contained else "bare"].append(result["cpu_s_per_step"])
    load.append(os.getloadavg()[0])
    pairs = [c / b - 1.0 for c, b in zip(cpu["contained"], cpu["bare"], strict=True)]
    return {
        "benchmark": "sandbox_cost",
        "contained": "bwrap + cgroup + own network namespace + seccomp + sized tmpfs",
        "start_ms": round(statistics.median(starts), 1),
        "start_ms_runs": [round(s, 1) for s in starts],
        "remove_ms": round(statistics.median(removals), 1),  # at the attempt's end
        "step_overhead": round(
            statistics.median(cpu["contained"]) / statistics.median(cpu["bare"]) - 1.0, 4
        ),
        "step_overhead_runs": [round(p, 4) for p in pairs],  # each pair's: the spread
        "cpu_ms_per_step_bare": [round(c * 1000, 3) for c in cpu["bare"]],
        "cpu_ms_per_step_contained": [round(c * 1000, 3) for c in cpu["contained"]],
        "load_average_1m": [round(x, 1) for x in load],
        "measure": "CPU time of rank 0 per step (process_time), MLP DDP gloo, 2 ranks, "
        f"{args.steps} steps, {args.repeats} pairs",
        "targets": {"start_ms": "< 100", "step_overhead": "< 0.02"},
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def containment(home: Path, address: str, steps: int) -> dict[str, object]:
    """Attacks from one tenant's trials while another tenant's two-rank trial runs."""
    plane_home = home / "plane-contained"
    plane_home.mkdir()
    plane = ControlPlaneProcess(
        plane_home, address, settings={"sandbox": "bwrap", "pids_per_rank": 128}
    )
    plane.start()
    codes = {}
    for name, script in (
        ("neighbour", NEIGHBOUR),
        ("attack", ATTACKS),
        ("allocate", ALLOCATE),
        ("busy", BUSY),
    ):
        codes[name] = home / f"code-{name}"
        codes[name].mkdir()
        (codes[name] / f"{name}.py").write_text(script)

    def submit(tenant: str, name: str, resources: dict[str, object], env: dict[str, str]) -> int:
        import httpx

        spec = {
            "name": name,
            "entrypoint": f"python {name}.py",
            "resources": resources,
            "max_restarts": 1,
            "environment": {"variables": env},
        }
        response = httpx.post(
            f"{plane.url}/api/v1/experiments",
            headers={"Authorization": f"Bearer {plane.token}"},
            data={"spec": json.dumps(spec), "tenant": tenant},
            files={"context": ("c.tar.gz", pack_dir(codes[name]), "application/gzip")},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        return int(response.json()["trials"][0]["id"])

    # One neighbour trial, long: its steps before and after the attacks are the quiet ones,
    # those while any attack trial runs the attacked ones. Quiet and attacked steps come from
    # the same trial minutes apart at most, so a machine whose load drifts (other work) moves
    # both alike; two trials run one after the other measured the drift as much as the attacks.
    total_steps = steps * 6

    def neighbour() -> int:
        resources = {"workers": 2, "cpus_per_worker": 0.5, "memory_gb_per_worker": 2}
        env = {"NEIGHBOUR_STEPS": str(total_steps), "NEIGHBOUR_SLEEP_S": "0.1"}
        return submit("neighbour", "neighbour", {**resources, "single_node": True}, env)

    def step_points(trial_id: int) -> list[dict[str, float]]:
        done = plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=900)
        assert done["num_restarts"] == 0, done
        points = plane.metrics(trial_id)
        assert [p["values"]["value"] for p in points] == [float(s) for s in range(total_steps)]
        return [p["values"] for p in points[3:]]  # past the first steps

    import socket

    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a host abstract socket
    abstract.bind(f"\0trainhub-bench-{os.getpid()}")
    abstract.listen(8)
    try:
        for tenant in ("neighbour", "attacker"):
            assert plane.request("POST", "/tenants", json={"name": tenant}).status_code == 201
        busy_neighbour = neighbour()
        deadline = time.monotonic() + 600
        store = ""
        while not store and time.monotonic() < deadline:
            found = [ln for ln in plane.log(busy_neighbour, 0).splitlines() if "STORE" in ln]
            store = found[0].split()[1] if found else ""
            time.sleep(0.3)
        while len(plane.metrics(busy_neighbour)) < 2 * steps and time.monotonic() < deadline:
            time.sleep(0.5)  # quiet steps first
        attacks_began = time.time()
        node_ip = address.rsplit(":", 1)[0]
        attack = submit(
            "attacker",
            "attack",
            {"workers": 1, "cpus_per_worker": 0.5, "memory_gb_per_worker": 0.5},
            {
                "ATTACK_SHM_MIB": "400",
                "ATTACK_STORE": f"{node_ip}:{store.rsplit(':', 1)[-1]}",
                "ATTACK_RAY": address,
                "ATTACK_ABSTRACT": f"trainhub-bench-{os.getpid()}",
            },
        )
        glutton = submit(
            "attacker",
            "allocate",
            {"workers": 1, "cpus_per_worker": 0.5, "memory_gb_per_worker": 0.5},
            {"ATTACK_ALLOCATE_MIB": "1536"},
        )
        share = 0.5
        busy = submit(
            "attacker",
            "busy",
            {"workers": 1, "cpus_per_worker": share},
            {"ATTACK_BUSY_S": "8", "ATTACK_BUSY_WORKERS": "4"},
        )
        plane.wait_for(attack, lambda t: t["state"] == "COMPLETED", timeout_s=300)
        results = {n: not r["allowed"] for n, r in parse(plane.log(attack, 0)).items()}
        oom = plane.wait_for(glutton, lambda t: t["state"] == "FAILED", timeout_s=300)
        results["allocate_past_memory"] = (
            "exceeded its 0.5 GiB memory limit" in (oom["message"] or "")
            and len(oom["attempts"]) == 2
        )
        plane.wait_for(busy, lambda t: t["state"] == "COMPLETED", timeout_s=300)
        line = next(ln for ln in plane.log(busy, 0).splitlines() if ln.startswith("BUSY "))
        numbers = dict(item.split("=") for item in line.split()[1:])
        cpu_share = float(numbers["cpu_s"]) / float(numbers["wall_s"])
        results["busy_past_cpu_share"] = cpu_share <= 1.2 * share
        attacks_ended = time.time()
        points = step_points(busy_neighbour)
        during = [p["step_time_s"] for p in points if attacks_began <= p["at"] <= attacks_ended]
        quiet = [p["step_time_s"] for p in points if not attacks_began <= p["at"] <= attacks_ended]
    finally:
        abstract.close()
        plane.stop()
    return {
        "benchmark": "containment",
        "attacks": len(results),
        "contained": sum(results.values()),
        "not_contained": sorted(n for n, ok in results.items() if not ok),
        "neighbour_slowdown": round(median(during) / median(quiet), 3),
        "neighbour_step_ms_quiet": round(median(quiet) * 1000, 2),
        "neighbour_step_ms_during": round(median(during) * 1000, 2),
        "neighbour_steps_quiet_during": [len(quiet), len(during)],
        "busy_cpu_share": round(cpu_share, 3),
        "busy_share_given": share,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "target": {"neighbour_slowdown": "<= 1.15"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--start-repeats", type=int, default=30)
    parser.add_argument(
        "--writes-only", action="store_true", help="only the write and authentication attacks"
    )
    parser.add_argument("--only", choices=("all", "containment"), default="all")
    parser.add_argument("--neighbour-steps", type=int, default=60)
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
        # no more CPUs than the machine has: the attacks' and the neighbour's shares must fit
        # it, or the neighbour's slowdown measures the overcommit, not the containment
        address = ensure_local_ray(home / "ray", num_cpus=min(4, os.cpu_count() or 4))
        if args.only == "containment":
            print(json.dumps(contained_cost(args, address, home / "contained")), flush=True)
            print(json.dumps(containment(home, address, args.neighbour_steps)), flush=True)
            return
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
        contained = contained_cost(args, address, home / "contained")
        contained_line = containment(home, address, args.neighbour_steps)
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
    print(json.dumps(contained), flush=True)
    print(json.dumps(contained_line), flush=True)


if __name__ == "__main__":
    main()
