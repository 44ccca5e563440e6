"""What contains one rank, as data: its namespaces, mounts, resource limits, syscalls, network.

:func:`isolation_profile` is a pure function of a trial's resources (the spec) and the node's
isolation settings (the server's): the rank actor applies the :class:`IsolationProfile` it gets
(bubblewrap arguments, cgroups, a network namespace, a seccomp filter: the adapters), and the
CLI and the trial page show the same profile, so what a user reads is what the kernel enforces.

Numbers are bytes and microseconds (the kernel's units); the spec's GB are GiB (2**30), as
Ray's ``memory`` resource and the placement already count them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

GIB = 1 << 30
# an attempt's rendezvous secret: the runtime keeps its torch.distributed store's keys under it
# (runtime/process_group.py reads the same name)
RENDEZVOUS_SECRET_ENV = "TRAINHUB_RENDEZVOUS_SECRET"
DEFAULT_PIDS_PER_RANK = 512
CPU_PERIOD_US = 100_000  # the CFS period a cpu quota is given in (the kernel's default)
# CFS refuses a quota under 1 ms; a 0.01-CPU rank gets that much per period
MIN_CPU_QUOTA_US = 1_000

# Syscalls no rank may make (the seccomp filter answers EPERM). clone with CLONE_NEWUSER is
# refused by an argument rule; clone3 hides its flags behind a pointer a filter cannot read,
# so it answers ENOSYS and the C library falls back to clone (what container runtimes do).
DENIED_SYSCALLS = (
    "unshare",  # new namespaces: a user namespace makes the rank root in it
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "userfaultfd",
)
NO_NEW_USER_NAMESPACE = "clone"  # refused when its flags hold CLONE_NEWUSER
FLAGS_HIDDEN = "clone3"  # answers ENOSYS
# ptrace of a process that is not already the caller's tracee: PTRACE_ATTACH and PTRACE_SEIZE
# (EPERM). Every other request acts on a tracee, and the only way to get one is a child's
# PTRACE_TRACEME (a debugger that starts its program: gdb, strace, pdb-style tools), so a rank
# may trace its own children and nothing else (docs/adr/0030: a filter cannot read pids'
# relations; the kernel's Yama scope 1 would, but it is not on every node).
TRACE_OTHERS = "ptrace"
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206


class NetworkMode(StrEnum):
    """Which network a rank is in."""

    TRIAL = "trial"  # a namespace of the trial's ranks on this node: loopback and the API only
    HOST = "host"  # the node's network (no sandbox, or the trial spans nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeIsolation:
    """A node's isolation settings (the server's; an admin sets them at start-up)."""

    cgroups: bool = True  # a cgroup per rank (memory, pids, cpu, io)
    network: bool = True  # a network namespace per trial on each of its nodes
    # a trial that spans nodes: a tunnel of its own between its namespaces (needs nftables to
    # accept the tunnel's packets from the cluster's nodes only; docs/adr/0030)
    cross_node: bool = True
    seccomp: bool = True
    pids_per_rank: int = DEFAULT_PIDS_PER_RANK
    # /tmp and /dev/shm of a rank without a memory limit (with one: half of it each; both are
    # charged to the rank's memory cgroup whatever their size)
    scratch_gb_without_memory_limit: float = 1.0
    io_weight: int = 100  # 10..1000, the rank's share of the disk's time against other groups

    def __post_init__(self) -> None:
        if self.pids_per_rank < 16:
            raise ValueError(f"pids_per_rank must be >= 16, got {self.pids_per_rank}")
        if not 10 <= self.io_weight <= 1000:
            raise ValueError(f"io_weight must be in 10..1000, got {self.io_weight}")
        if self.scratch_gb_without_memory_limit <= 0:
            raise ValueError("scratch_gb_without_memory_limit must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResources:
    """The spec's resources, as the profile needs them."""

    cpus_per_worker: float
    memory_gb_per_worker: float | None = None
    pin_cpus: bool = False  # give each rank whole cores of its own (cpuset)
    num_nodes: int = 1  # how many nodes the trial's ranks were placed on


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """One rank's cgroup."""

    memory_bytes: int | None  # memory.max / memory.limit_in_bytes; None: unlimited
    swap_bytes: int  # 0: no swap (memory.swap.max / memsw equal to the memory limit)
    pids_max: int
    cpu_quota_us: int  # per CPU_PERIOD_US: cpus_per_worker of CPU time
    cpu_period_us: int
    pinned_cpus: int | None  # whole cores to pin to (cpuset), None: no pinning
    io_weight: int


@dataclass(frozen=True, slots=True)
class Tmpfs:
    """A size-limited tmpfs the sandbox mounts (its pages count in the rank's memory)."""

    target: str
    size_bytes: int
    mode: int = 0o1777


@dataclass(frozen=True, slots=True)
class IsolationProfile:
    """Everything that contains one rank, applied by the rank actor on its node."""

    namespaces: tuple[str, ...]  # bwrap --unshare-* (pid, ipc, uts, cgroup, net)
    tmpfs: tuple[Tmpfs, ...]
    mask_sys: bool  # /sys is not mounted (an empty tmpfs stands in its place)
    new_session: bool  # setsid: no TIOCSTI into a terminal of the node agent
    limits: ResourceLimits | None  # None: no cgroup (the node has cgroups off)
    network: NetworkMode
    network_note: str  # why this network, for people
    denied_syscalls: tuple[str, ...]  # empty: no seccomp filter

    def summary(self) -> dict[str, str]:
        """What a user reads in `trainhub show` and on the trial page."""
        shown: dict[str, str] = {}
        limits = self.limits
        if limits is None:
            shown["cgroup"] = "none (cgroups off on this node)"
        else:
            shown["memory"] = (
                "unlimited"
                if limits.memory_bytes is None
                else f"{gib(limits.memory_bytes)}, no swap"
            )
            cpus = limits.cpu_quota_us / limits.cpu_period_us
            pinned = f", pinned to {limits.pinned_cpus} cores" if limits.pinned_cpus else ""
            shown["cpu"] = f"{cpus:g} CPU{pinned}"
            shown["processes"] = str(limits.pids_max)
            shown["io_weight"] = str(limits.io_weight)
        for mount in self.tmpfs:
            shown[mount.target] = gib(mount.size_bytes)
        shown["network"] = f"{self.network.value}: {self.network_note}"
        shown["seccomp"] = (
            f"{len(self.denied_syscalls) + 1} syscalls refused, user namespaces among them; "
            "ptrace of its own children only"
            if self.denied_syscalls
            else "off"
        )
        return shown


def isolation_profile(resources: TrialResources, node: NodeIsolation) -> IsolationProfile:
    """The profile of every rank of a trial with ``resources`` on a node with ``node``."""
    memory = _memory_bytes(resources.memory_gb_per_worker)
    scratch = memory // 2 if memory is not None else int(node.scratch_gb_without_memory_limit * GIB)
    limits = None
    if node.cgroups:
        quota = max(MIN_CPU_QUOTA_US, round(resources.cpus_per_worker * CPU_PERIOD_US))
        pinned = max(1, round(resources.cpus_per_worker)) if resources.pin_cpus else None
        limits = ResourceLimits(
            memory_bytes=memory,
            swap_bytes=0,
            pids_max=node.pids_per_rank,
            cpu_quota_us=quota,
            cpu_period_us=CPU_PERIOD_US,
            pinned_cpus=pinned,
            io_weight=node.io_weight,
        )
    network, note = _network(resources, node)
    namespaces: tuple[str, ...] = ("pid", "ipc", "uts", "cgroup")
    if network == NetworkMode.TRIAL:
        namespaces += ("net",)
    return IsolationProfile(
        namespaces=namespaces,
        tmpfs=(Tmpfs("/tmp", scratch), Tmpfs("/dev/shm", scratch)),
        mask_sys=True,
        new_session=True,
        limits=limits,
        network=network,
        network_note=note,
        denied_syscalls=DENIED_SYSCALLS if node.seccomp else (),
    )


def memory_exceeded(rank: int, limit_bytes: int, peak_bytes: int) -> str:
    """The reason of an attempt whose rank the kernel OOM-killed inside its cgroup."""
    return f"rank {rank} exceeded its {gib(limit_bytes)} memory limit: peak {gib(peak_bytes, 1)}"


OOM_MARK = "memory limit: peak"  # in every memory_exceeded() reason (verdicts look for it)


def gib(num_bytes: int, decimals: int | None = None) -> str:
    """``1 GiB``, ``1.5 GiB``; with ``decimals``, always that many (``1.0 GiB``)."""
    value = num_bytes / GIB
    if decimals is not None:
        return f"{value:.{decimals}f} GiB"
    return f"{value:.3g} GiB" if value >= 0.01 else f"{num_bytes // (1 << 20)} MiB"


def _memory_bytes(memory_gb: float | None) -> int | None:
    if memory_gb is None:
        return None
    return int(memory_gb * GIB) // 4096 * 4096  # whole pages, as the kernel rounds


def _network(resources: TrialResources, node: NodeIsolation) -> tuple[NetworkMode, str]:
    if not node.network:
        return NetworkMode.HOST, "the node's network (per-trial networks off on this node)"
    if resources.num_nodes > 1:
        if not node.cross_node:
            return (
                NetworkMode.HOST,
                "the node's network: the trial spans nodes and this cluster has no tunnels "
                "(docs/adr/0030); its rendezvous store still needs the trial's secret",
            )
        return (
            NetworkMode.TRIAL,
            f"the trial's own ranks on its {resources.num_nodes} nodes (a tunnel of its own) "
            "and the control plane's API only",
        )
    return NetworkMode.TRIAL, "loopback of the trial's ranks and the control plane's API only"
