"""Which part of a contained rank costs CPU time per step: each part alone, measured in turns.

The ``sandbox_cost`` line of benchmarks/isolation.py compares a whole contained rank with a
bare one through the executor. This runs the same two-rank DDP workload
(benchmarks/workloads/ddp_mlp.py, gloo on loopback) as two plain processes, without Ray, in
each of these variants, one after the other, ``--repeats`` rounds (the order rotated each round):

- ``bare``: no sandbox;
- ``bwrap``: the sandbox of ADR 0007 (namespaces, read-only mounts, uid);
- ``profile``: plus the profile's bwrap part (sized tmpfs, masked /sys, new session);
- ``seccomp``: plus the seccomp filter;
- ``cgroup``: plus a rank cgroup with memory, pids and the CPU quota (``--cpus`` per rank);
- ``cgroup_no_quota``: the same cgroup without the CPU quota;
- ``cgroup_default_weight``: the cgroup with one task's CPU weight for it and for the group
  of all ranks (the kernel's default, as before ADR 0030);
- ``netns``: plus the trial's network namespace (the ranks rendezvous on its loopback);
- ``all``: everything, as a contained rank runs.

One JSON line per variant: rank 0's CPU time per step (median of the rounds, each round's
value) and its ratio to ``bare`` of the same round; the load average before and after.

    .venv/bin/python benchmarks/containment_parts.py [--repeats 5] [--steps 400]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainhub.adapters import cgroups, sandbox, seccomp, trial_network  # noqa: E402
from trainhub.core.isolation import (  # noqa: E402
    NodeIsolation,
    ResourceLimits,
    TrialResources,
    isolation_profile,
)

WORKLOAD = REPO / "benchmarks" / "workloads" / "ddp_mlp.py"
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)
VARIANTS = (
    "bare",
    "bwrap",
    "profile",
    "seccomp",
    "cgroup",
    "cgroup_no_quota",
    "cgroup_default_weight",
    "netns",
    "all",
)
DEFAULT_WEIGHT_GROUP = "trainhub-default-weight"  # the cgroups as they were before ADR 0030


def run_variant(variant: str, steps: int, cpus: float, index: int) -> dict[str, float]:
    """Rank 0's RESULT of one two-rank run in ``variant`` (CPU time, faults, switches)."""
    bwrap = sandbox.bwrap_path()
    assert bwrap is not None
    parts = {
        "seccomp": variant in ("seccomp", "all"),
        "cgroup": variant in ("cgroup", "cgroup_no_quota", "cgroup_default_weight", "all"),
        "netns": variant in ("netns", "all"),
    }
    node = NodeIsolation(cgroups=parts["cgroup"], network=parts["netns"], seccomp=parts["seccomp"])
    profile = isolation_profile(TrialResources(cpus_per_worker=cpus, memory_gb_per_worker=2), node)
    mounts = [sandbox.Mount(p, p) for p in sandbox.safe_mounts(sandbox.python_paths(), [])]
    mounts.append(sandbox.Mount(str(WORKLOAD.parent), sandbox.CODE_DIR))
    uid = sandbox.SANDBOX_UID_BASE if os.geteuid() == 0 else None
    network = None
    if parts["netns"]:
        network = trial_network.TrialNetwork.ensure(
            trial_network.namespace_name(f"parts-{os.getpid()}-{index}"), []
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs, groups, fds = [], [], []
    try:
        for rank in (0, 1):
            env = {
                "PATH": os.environ["PATH"],
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
            }
            script = [sys.executable, f"{sandbox.CODE_DIR}/ddp_mlp.py", "--steps", str(steps)]
            group = None
            if parts["cgroup"]:
                assert profile.limits is not None
                limits = profile.limits
                if variant == "cgroup_no_quota":
                    limits = dataclasses.replace(limits, cpu_quota_us=-1)
                name = f"parts-{os.getpid()}-{index}-{rank}"
                if variant == "cgroup_default_weight":
                    group = _default_weight_cgroup(name, limits)
                else:
                    group = cgroups.create_rank_cgroup(name, limits)
                groups.append(group)
            fd = seccomp.filter_fd(profile.denied_syscalls) if parts["seccomp"] else None
            if fd is not None:
                fds.append(fd)
            if variant == "bare":
                argv = [sys.executable, str(WORKLOAD), "--steps", str(steps)]
            else:
                plan = sandbox.SandboxPlan(tuple(mounts), sandbox.CODE_DIR, uid)
                if variant != "bwrap":
                    plan = dataclasses.replace(plan, profile=profile, seccomp_fd=fd)
                argv = sandbox.bwrap_argv(bwrap, plan, script)
            netns_fd = network.open() if network is not None else None

            def enter(group: cgroups.BaseRankCgroup | None = group, ns: int | None = netns_fd):
                if group is not None:
                    group.join()
                if ns is not None:
                    trial_network.join(ns)

            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    preexec_fn=enter,  # noqa: PLW1509
                    pass_fds=(fd,) if fd is not None else (),
                )
            )
            if netns_fd is not None:
                os.close(netns_fd)
        outputs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for fd in fds:
            os.close(fd)
        for group in groups:
            group.remove()
        if network is not None:
            network.remove()
    match = RESULT.search(outputs[0])
    assert match, outputs
    return dict(json.loads(match.group(1)))


def _default_weight_cgroup(name: str, limits: ResourceLimits) -> cgroups.BaseRankCgroup:
    """A rank cgroup whose group and itself have one task's CPU weight (before ADR 0030)."""
    cgroups.GROUP = DEFAULT_WEIGHT_GROUP
    try:
        group = cgroups.create_rank_cgroup(name, limits)
    finally:
        cgroups.GROUP = "trainhub"
    for folder in group.folders():
        for target in (folder, folder.parent):
            if (target / "cpu.shares").exists():
                (target / "cpu.shares").write_text("1024")
            elif (target / "cpu.weight").exists():
                (target / "cpu.weight").write_text("100")
    return group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--cpus", type=float, default=1.0, help="cpus_per_worker of the quota")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = args.variants.split(",")
    tempfile.tempdir = tempfile.mkdtemp(prefix="parts-")
    load = [os.getloadavg()[0]]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for index, variant in enumerate(order):
            result = run_variant(variant, args.steps, args.cpus, repeat * 100 + index)
            runs[variant].append(result)
            print(json.dumps({"variant": variant, "round": repeat, **result}), file=sys.stderr)
    load.append(os.getloadavg()[0])

    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[variant])

    for variant in variants:
        cpu = [r["cpu_s_per_step"] for r in runs[variant]]
        bare = [r["cpu_s_per_step"] for r in runs["bare"]]
        ratios = [c / b - 1.0 for c, b in zip(cpu, bare, strict=True)]
        print(
            json.dumps(
                {
                    "benchmark": "containment_parts",
                    "variant": variant,
                    "cpu_ms_per_step": round(statistics.median(cpu) * 1000, 3),
                    "cpu_ms_per_step_runs": [round(c * 1000, 3) for c in cpu],
                    "overhead_vs_bare": round(
                        statistics.median(cpu) / statistics.median(bare) - 1, 4
                    ),
                    "overhead_runs": [round(r, 4) for r in ratios],
                    **{
                        key: round(median(variant, key), 3)
                        for key in (
                            "user_ms_per_step",
                            "sys_ms_per_step",
                            "minflt_per_step",
                            "nvcsw_per_step",
                            "nivcsw_per_step",
                        )
                    },
                    "load_average_1m": [round(x, 1) for x in load],
                    "steps": args.steps,
                    "cpus_per_rank": args.cpus,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
