"""A rank's cgroup on the real kernel: v1 here (root, the node's own memory cgroup), v2 where
a unified subtree is delegated. Each limit is checked by a process that tries to pass it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from trainhub.adapters.cgroups import (
    BaseRankCgroup,
    CgroupUnavailable,
    CgroupV1,
    CgroupV2,
    _v2_delegated,
    cgroup_problem,
)
from trainhub.core.isolation import CPU_PERIOD_US, ResourceLimits

MIB = 1 << 20
LIMITS = ResourceLimits(
    memory_bytes=128 * MIB,
    swap_bytes=0,
    pids_max=32,
    cpu_quota_us=CPU_PERIOD_US // 2,
    cpu_period_us=CPU_PERIOD_US,
    pinned_cpus=None,
    io_weight=100,
)


def make(version: int, name: str) -> BaseRankCgroup:
    if version == 2:
        if not _v2_delegated():
            pytest.skip("no delegated cgroup v2 subtree on this machine (v1 only)")
        return CgroupV2(name, LIMITS)
    try:
        return CgroupV1(name, LIMITS)
    except CgroupUnavailable as exc:
        pytest.skip(f"no writable cgroup v1 hierarchies: {exc}")


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def group(request: pytest.FixtureRequest):
    made = make(request.param, f"test-{request.node.name[:40]}-{time.monotonic_ns()}")
    yield made
    made.remove()
    assert not any(folder.exists() for folder in made.folders())


def run_in(group: BaseRankCgroup, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=group.join,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_process_past_the_memory_limit_is_killed_inside_the_cgroup(group: BaseRankCgroup):
    done = run_in(group, "b = bytearray(400 << 20); print('survived')")
    assert done.returncode == -9, done
    assert "survived" not in done.stdout
    assert group.oom_kills() >= 1
    assert 100 * MIB <= group.peak_memory_bytes() <= 130 * MIB


def test_processes_stop_at_the_pids_limit(group: BaseRankCgroup):
    code = (
        "import subprocess\nps = []\ntry:\n"
        "    for _ in range(100): ps.append(subprocess.Popen(['sleep', '10']))\n"
        "except OSError as e: print('stopped', len(ps))\n"
        "for p in ps: p.kill()\n"
    )
    done = run_in(group, code)
    assert "stopped" in done.stdout, done
    assert int(done.stdout.split()[-1]) < 32


def test_cpu_time_is_held_to_the_quota(group: BaseRankCgroup):
    code = (
        "import os, time\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        end = time.monotonic() + 3\n"
        "        while time.monotonic() < end: pass\n"
        "        os._exit(0)\n"
        "os.wait(); os.wait()\n"
    )
    began = time.monotonic()
    run_in(group, code)
    wall = time.monotonic() - began
    # two busy processes for 3 s would use 6 CPU-seconds; the quota is half a CPU
    assert group.cpu_time_s() <= 0.5 * wall * 1.2 + 0.2


def test_the_node_says_whether_it_can_make_rank_cgroups():
    problem = cgroup_problem()
    assert problem is None or "cgroup" in problem
