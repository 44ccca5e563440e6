"""The isolation profile is a pure function of a trial's resources and a node's settings."""

from __future__ import annotations

import pytest

from trainhub.core.isolation import (
    CPU_PERIOD_US,
    DEFAULT_PIDS_PER_RANK,
    DENIED_SYSCALLS,
    GIB,
    NetworkMode,
    NodeIsolation,
    TrialResources,
    gib,
    isolation_profile,
    memory_exceeded,
)

NODE = NodeIsolation()


def test_memory_cpu_and_pids_come_from_the_spec_and_the_node() -> None:
    profile = isolation_profile(TrialResources(cpus_per_worker=2, memory_gb_per_worker=1), NODE)
    limits = profile.limits
    assert limits is not None
    assert limits.memory_bytes == GIB
    assert limits.swap_bytes == 0
    assert limits.cpu_quota_us == 2 * CPU_PERIOD_US
    assert limits.cpu_period_us == CPU_PERIOD_US
    assert limits.pids_max == DEFAULT_PIDS_PER_RANK
    assert limits.pinned_cpus is None
    assert limits.io_weight == 100


def test_scratch_is_half_the_memory_each_or_the_node_default() -> None:
    limited = isolation_profile(TrialResources(cpus_per_worker=1, memory_gb_per_worker=4), NODE)
    assert [(t.target, t.size_bytes) for t in limited.tmpfs] == [
        ("/tmp", 2 * GIB),
        ("/dev/shm", 2 * GIB),
    ]
    node = NodeIsolation(scratch_gb_without_memory_limit=0.5)
    unlimited = isolation_profile(TrialResources(cpus_per_worker=1), node)
    assert unlimited.limits is not None
    assert unlimited.limits.memory_bytes is None
    assert {t.size_bytes for t in unlimited.tmpfs} == {GIB // 2}


def test_a_tiny_cpu_share_gets_the_smallest_quota_the_kernel_takes() -> None:
    profile = isolation_profile(TrialResources(cpus_per_worker=0.001), NODE)
    assert profile.limits is not None
    assert profile.limits.cpu_quota_us == 1_000


def test_pinning_takes_whole_cores() -> None:
    resources = TrialResources(cpus_per_worker=1.6, pin_cpus=True)
    profile = isolation_profile(resources, NODE)
    assert profile.limits is not None
    assert profile.limits.pinned_cpus == 2


def test_an_admin_sets_the_process_limit() -> None:
    node = NodeIsolation(pids_per_rank=64)
    limits = isolation_profile(TrialResources(cpus_per_worker=1), node).limits
    assert limits is not None
    assert limits.pids_max == 64
    with pytest.raises(ValueError, match="pids_per_rank"):
        NodeIsolation(pids_per_rank=3)


def test_a_trial_on_one_node_gets_a_network_of_its_own() -> None:
    profile = isolation_profile(TrialResources(cpus_per_worker=1), NODE)
    assert profile.network == NetworkMode.TRIAL
    assert "net" in profile.namespaces


def test_a_trial_across_nodes_gets_a_tunnel_of_its_own() -> None:
    profile = isolation_profile(TrialResources(cpus_per_worker=1, num_nodes=2), NODE)
    assert profile.network == NetworkMode.TRIAL
    assert "net" in profile.namespaces
    assert "its 2 nodes (a tunnel of its own)" in profile.network_note


def test_without_tunnels_a_trial_across_nodes_keeps_the_node_network_and_says_so() -> None:
    node = NodeIsolation(cross_node=False)
    profile = isolation_profile(TrialResources(cpus_per_worker=1, num_nodes=2), node)
    assert profile.network == NetworkMode.HOST
    assert "net" not in profile.namespaces
    assert "spans nodes" in profile.network_note
    single = isolation_profile(TrialResources(cpus_per_worker=1), node)
    assert single.network == NetworkMode.TRIAL  # one node needs no tunnel


def test_what_the_node_cannot_do_is_off_in_the_profile() -> None:
    node = NodeIsolation(cgroups=False, network=False, seccomp=False)
    profile = isolation_profile(TrialResources(cpus_per_worker=1, memory_gb_per_worker=1), node)
    assert profile.limits is None
    assert profile.network == NetworkMode.HOST
    assert profile.denied_syscalls == ()
    shown = profile.summary()
    assert shown["cgroup"].startswith("none")
    assert shown["seccomp"] == "off"


def test_every_profile_masks_sys_starts_a_session_and_refuses_namespaces() -> None:
    profile = isolation_profile(TrialResources(cpus_per_worker=1), NODE)
    assert profile.mask_sys
    assert profile.new_session
    for name in ("unshare", "mount", "bpf", "keyctl", "perf_event_open", "process_vm_writev"):
        assert name in profile.denied_syscalls
    assert profile.denied_syscalls == DENIED_SYSCALLS
    # ptrace is refused by its request (attach, seize), not as a whole: children may be traced
    assert "ptrace" not in profile.denied_syscalls
    assert "ptrace of its own children only" in profile.summary()["seccomp"]


def test_the_summary_is_what_a_user_reads() -> None:
    resources = TrialResources(cpus_per_worker=0.5, memory_gb_per_worker=1)
    shown = isolation_profile(resources, NODE).summary()
    assert shown["memory"] == "1 GiB, no swap"
    assert shown["cpu"] == "0.5 CPU"
    assert shown["processes"] == "512"
    assert shown["/dev/shm"] == "0.5 GiB"
    assert shown["network"].startswith("trial:")


def test_the_oom_reason_names_rank_limit_and_peak() -> None:
    assert memory_exceeded(1, GIB, GIB) == "rank 1 exceeded its 1 GiB memory limit: peak 1.0 GiB"
    assert gib(GIB // 2) == "0.5 GiB"
    assert gib(1 << 20) == "1 MiB"
