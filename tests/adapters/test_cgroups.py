"""A rank's cgroup on the real kernel: v1 here (root, the node's own memory cgroup), v2 where
a unified subtree is delegated. Each limit is checked by a process that tries to pass it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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


def v2_reason() -> str:
    """Why the v2 tests cannot run here: which controllers the kernel keeps in v1 hierarchies.

    A controller lives in one hierarchy at a time: while memory, pids and cpu are mounted as v1
    (these machines), a cgroup2 mount (``mount -t cgroup2 none /x`` works as root) offers
    none of them; freeing them means unmounting the v1 hierarchies every process here is in.
    """
    in_v1 = []
    with open("/proc/cgroups") as table:  # subsys_name hierarchy num_cgroups enabled
        for line in table.read().splitlines()[1:]:
            name, hierarchy, _, enabled = line.split()
            if name in ("memory", "pids", "cpu") and hierarchy != "0" and enabled == "1":
                in_v1.append(name)
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    offered = unified.read_text().split() if unified.exists() else []
    return (
        "no delegated cgroup v2 subtree here: the kernel keeps "
        f"{', '.join(in_v1) or 'the needed controllers'} in v1 hierarchies, so a cgroup2 "
        f"hierarchy offers only {offered or 'no controller'} (not memory, pids, cpu)"
    )


def make(version: int, name: str) -> BaseRankCgroup:
    if version == 2:
        if not _v2_delegated():
            pytest.skip(v2_reason())
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


def _group_weighs_its_ranks(group_folder: Path, name: str) -> bool:
    """The group's weight equals the sum of its ranks' weights, read at one moment: other test
    workers' ranks come and go in the same group, so a read that straddles one is read again."""
    for _ in range(100):
        siblings = sum(
            int((child / name).read_text())
            for child in group_folder.iterdir()
            if child.is_dir() and (child / name).exists()
        )
        if int((group_folder / name).read_text()) == siblings:
            return True
        time.sleep(0.02)
    return False


def test_ranks_weigh_by_their_cpus_and_their_group_by_the_sum(group: BaseRankCgroup):
    """The group of every rank cgroup weighs what its ranks weigh together (at one task's
    weight, the default, all contained ranks together got one busy process's share)."""
    name = "cpu.shares" if group.version == 1 else "cpu.weight"
    folder = next(f for f in group.folders() if (f / name).exists())
    assert int((folder / name).read_text()) == (512 if group.version == 1 else 50)  # 0.5 CPU
    assert _group_weighs_its_ranks(folder.parent, name)  # this rank's among them
    second = make(group.version, f"{folder.name}-second")
    try:
        assert (folder.parent / f"{folder.name}-second" / name).exists()
        assert _group_weighs_its_ranks(folder.parent, name)  # the second's weight added
    finally:
        second.remove()
    assert _group_weighs_its_ranks(folder.parent, name)  # and taken off again
