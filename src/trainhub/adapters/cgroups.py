"""A cgroup of its own for every rank: memory, pids, cpu (and cpuset, io) limits the kernel keeps.

One interface (:class:`BaseRankCgroup`), two implementations: :class:`CgroupV2` under a
delegated subtree of the unified hierarchy, :class:`CgroupV1` with a child in each v1 hierarchy
this process may write (memory under its own memory cgroup, pids, cpu, cpuacct, cpuset, blkio).
:func:`create_rank_cgroup` picks the one the node has. The rank's process joins its cgroup
between fork and exec (:meth:`BaseRankCgroup.join`), so bwrap and everything it starts are in
it from their first instruction.

A rank that allocates past its memory limit is OOM-killed by the kernel inside its cgroup: the
cgroup's OOM-kill counter says so afterwards, and :meth:`BaseRankCgroup.oom_kills` reads it.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path

from trainhub.core.isolation import ResourceLimits

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "trainhub"  # the folder under which every rank's cgroup is made
_V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "cpuset", "blkio")
_V2_CONTROLLERS = ("memory", "pids", "cpu")  # needed; cpuset and io are used where present


class CgroupUnavailable(RuntimeError):
    """No cgroup this process may create and limit."""


class BaseRankCgroup(ABC):
    """The cgroup of one rank: created with its limits, joined, read, removed."""

    version: int

    @abstractmethod
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join (before exec)."""

    @abstractmethod
    def oom_kills(self) -> int:
        """How many processes the kernel killed in this cgroup for exceeding its memory."""

    @abstractmethod
    def peak_memory_bytes(self) -> int:
        """The most memory the cgroup held at once (anonymous, page cache, tmpfs)."""

    @abstractmethod
    def cpu_time_s(self) -> float:
        """CPU time the cgroup's processes used, user and system."""

    @abstractmethod
    def folders(self) -> list[Path]:
        """The cgroup's folders (removed by :meth:`remove`, innermost last)."""

    def join(self) -> None:
        """In the forked child, before exec: move this process into the cgroup."""
        pid = str(os.getpid()).encode()
        for path in self.procs_files():
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Remove the cgroup once its processes have gone (the kernel refuses it before)."""
        deadline = time.monotonic() + timeout_s
        for folder in self.folders():
            while folder.exists():
                try:
                    folder.rmdir()
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    _kill_all(folder / "cgroup.procs")
                    time.sleep(0.002)
            for name, least, most in (("cpu.shares", 2, 262_144), ("cpu.weight", 1, 10_000)):
                if (folder.parent / name).exists() and folder.parent.name == GROUP:
                    _weigh_group(folder.parent, name, least, most)


class CgroupV1(BaseRankCgroup):
    """A child in each v1 hierarchy (the node's own cgroup of that controller as parent)."""

    version = 1

    def __init__(self, name: str, limits: ResourceLimits) -> None:
        own = _own_v1_paths()
        missing = [c for c in ("memory", "pids", "cpu") if c not in own]
        if missing:
            raise CgroupUnavailable(f"no cgroup v1 hierarchy for {', '.join(missing)}")
        self._dirs: dict[str, Path] = {}
        try:
            for controller in _V1_CONTROLLERS:
                if controller not in own or (controller == "cpuset" and not limits.pinned_cpus):
                    continue
                parent = own[controller] / GROUP
                if controller == "cpuset":
                    _init_cpuset_v1(parent)
                parent.mkdir(exist_ok=True)
                folder = parent / name
                folder.mkdir(exist_ok=True)
                self._dirs[controller] = folder
            self._limit(limits)
        except OSError as exc:
            self.remove(timeout_s=0)
            raise CgroupUnavailable(f"cannot create a v1 cgroup {name}: {exc}") from exc

    def _limit(self, limits: ResourceLimits) -> None:
        memory = self._dirs["memory"]
        if limits.memory_bytes is not None:
            _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
            swap = memory / "memory.memsw.limit_in_bytes"  # memory + swap: equal means no swap
            if swap.exists():
                _write(swap, limits.memory_bytes + limits.swap_bytes)
            else:
                _write(memory / "memory.swappiness", 0)
        _write(self._dirs["pids"] / "pids.max", limits.pids_max)
        cpu = self._dirs["cpu"]
        _write(cpu / "cpu.cfs_period_us", limits.cpu_period_us)
        _write(cpu / "cpu.cfs_quota_us", limits.cpu_quota_us)
        _write(cpu / "cpu.shares", max(2, round(1024 * _cpus(limits))))
        _weigh_group(cpu.parent, "cpu.shares", 2, 262_144)
        if "cpuset" in self._dirs and limits.pinned_cpus:
            cpuset = self._dirs["cpuset"]
            _write(cpuset / "cpuset.mems", (cpuset.parent / "cpuset.mems").read_text().strip())
            _write(cpuset / "cpuset.cpus", _pick_cpus(cpuset.parent, limits.pinned_cpus, 1))
        weight = self._dirs.get("blkio", Path("/nonexistent")) / "blkio.bfq.weight"
        if weight.exists():  # only with the BFQ scheduler; the io weight is best effort
            with contextlib.suppress(OSError):
                _write(weight, limits.io_weight)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self._dirs.values()]

    def oom_kills(self) -> int:
        return _field(self._dirs["memory"] / "memory.oom_control", "oom_kill")

    def peak_memory_bytes(self) -> int:
        return _read_int(self._dirs["memory"] / "memory.max_usage_in_bytes")

    def cpu_time_s(self) -> float:
        if "cpuacct" in self._dirs:
            return _read_int(self._dirs["cpuacct"] / "cpuacct.usage") / 1e9
        return 0.0

    def folders(self) -> list[Path]:
        return list(self._dirs.values())


class CgroupV2(BaseRankCgroup):
    """A child of this process's cgroup's parent in the unified hierarchy (a delegated subtree).

    The parent must let us enable memory, pids and cpu for its children (``cgroup.subtree_
    control``); systemd gives a service that with ``Delegate=yes``.
    """

    version = 2

    def __init__(self, name: str, limits: ResourceLimits, root: Path | None = None) -> None:
        base = root or _v2_base()
        try:
            base.mkdir(exist_ok=True)
            available = (base / "cgroup.controllers").read_text().split()
            wanted = [c for c in (*_V2_CONTROLLERS, "cpuset", "io") if c in available]
            if not set(_V2_CONTROLLERS) <= set(wanted):
                raise CgroupUnavailable(
                    f"{base} lacks {', '.join(set(_V2_CONTROLLERS) - set(wanted))} (not delegated)"
                )
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            self._dir = base / name
            self._dir.mkdir(exist_ok=True)
            self._limit(limits)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create a v2 cgroup under {base}: {exc}") from exc

    def _limit(self, limits: ResourceLimits) -> None:
        folder = self._dir
        if limits.memory_bytes is not None:
            _write(folder / "memory.max", limits.memory_bytes)
            _write(folder / "memory.swap.max", limits.swap_bytes)
            with contextlib.suppress(OSError):  # one process killed alone would leave a half rank
                _write(folder / "memory.oom.group", 1)
        _write(folder / "pids.max", limits.pids_max)
        _write(folder / "cpu.max", f"{limits.cpu_quota_us} {limits.cpu_period_us}")
        _write(folder / "cpu.weight", max(1, min(10_000, round(100 * _cpus(limits)))))
        _weigh_group(folder.parent, "cpu.weight", 1, 10_000)
        if limits.pinned_cpus and (folder / "cpuset.cpus").exists():
            _write(folder / "cpuset.cpus", _pick_cpus(folder.parent, limits.pinned_cpus, 2))
        if (folder / "io.weight").exists():
            with contextlib.suppress(OSError):
                _write(folder / "io.weight", f"default {limits.io_weight}")

    def procs_files(self) -> list[str]:
        return [str(self._dir / "cgroup.procs")]

    def oom_kills(self) -> int:
        return _field(self._dir / "memory.events", "oom_kill")

    def peak_memory_bytes(self) -> int:
        peak = self._dir / "memory.peak"  # Linux 5.19+
        return _read_int(peak) if peak.exists() else _read_int(self._dir / "memory.current")

    def cpu_time_s(self) -> float:
        return _field(self._dir / "cpu.stat", "usage_usec") / 1e6

    def folders(self) -> list[Path]:
        return [self._dir]


class LeftoverCgroup(BaseRankCgroup):
    """The folders of a rank's cgroup whose actor died (node_leftovers.py): removed, no more."""

    version = 0

    def __init__(self, folders: list[Path]) -> None:
        self._folders = folders

    def procs_files(self) -> list[str]:
        return [str(f / "cgroup.procs") for f in self._folders]

    def oom_kills(self) -> int:
        return 0

    def peak_memory_bytes(self) -> int:
        return 0

    def cpu_time_s(self) -> float:
        return 0.0

    def folders(self) -> list[Path]:
        return list(self._folders)


def create_rank_cgroup(name: str, limits: ResourceLimits) -> BaseRankCgroup:
    """The rank's cgroup: v2 where this node delegates a unified subtree, else v1."""
    problems: list[str] = []
    if _v2_delegated():
        try:
            return CgroupV2(name, limits)
        except CgroupUnavailable as exc:
            problems.append(str(exc))
    try:
        return CgroupV1(name, limits)
    except CgroupUnavailable as exc:
        problems.append(str(exc))
    raise CgroupUnavailable("; ".join(problems))


def cgroup_problem() -> str | None:
    """Why no rank cgroup can be made here (None when one can): the tests' skip reason."""
    from trainhub.core.isolation import CPU_PERIOD_US

    probe = ResourceLimits(1 << 30, 0, 64, CPU_PERIOD_US, CPU_PERIOD_US, None, 100)
    try:
        group = create_rank_cgroup(f"probe-{os.getpid()}", probe)
    except CgroupUnavailable as exc:
        return str(exc)
    group.remove()
    return None


# --- the hierarchies of this process ---


def _own_v1_paths() -> dict[str, Path]:
    """controller -> the folder of this process's cgroup in that v1 hierarchy (writable)."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            mount = CGROUP_ROOT / controller
            if controller in _V1_CONTROLLERS and (mount / "cgroup.procs").exists():
                folder = mount / path.lstrip("/")
                if os.access(folder, os.W_OK):
                    found[controller] = folder
    return found


def _v2_own() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            mount = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else None
            if mount is None and (CGROUP_ROOT / "unified" / "cgroup.controllers").exists():
                mount = CGROUP_ROOT / "unified"
            if mount is None:
                return None
            return mount / line[3:].lstrip("/")
    return None


def _v2_base() -> Path:
    own = _v2_own()
    if own is None:
        raise CgroupUnavailable("no cgroup v2 hierarchy")
    # the rank cgroups are siblings of ours: a cgroup with processes cannot have controllers
    # enabled for its children (the no-internal-processes rule)
    return own.parent / GROUP if own.parent != own else own / GROUP


def _v2_delegated() -> bool:
    own = _v2_own()
    if own is None:
        return False
    try:
        available = (own.parent / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return set(_V2_CONTROLLERS) <= set(available) and os.access(own.parent, os.W_OK)


def _init_cpuset_v1(parent: Path) -> None:
    """A v1 cpuset child starts with no CPU: give the group folder its parent's."""
    if parent.exists():
        return
    parent.mkdir()
    for name in ("cpuset.cpus", "cpuset.mems"):
        _write(parent / name, (parent.parent / name).read_text().strip())


def _pick_cpus(group: Path, count: int, version: int) -> str:
    """``count`` cores of the group's, the least pinned by other ranks first."""
    name = "cpuset.cpus.effective" if version == 2 else "cpuset.cpus"
    cpus = _cpu_list((group / name).read_text()) or list(range(os.cpu_count() or 1))
    use = dict.fromkeys(cpus, 0)
    for sibling in group.iterdir():
        if sibling.is_dir():
            with contextlib.suppress(OSError):
                for cpu in _cpu_list((sibling / "cpuset.cpus").read_text()):
                    if cpu in use:
                        use[cpu] += 1
    chosen = sorted(cpus, key=lambda c: (use[c], c))[: min(count, len(cpus))]
    return ",".join(str(c) for c in sorted(chosen))


def _cpus(limits: ResourceLimits) -> float:
    return limits.cpu_quota_us / limits.cpu_period_us


def _weigh_group(group: Path, name: str, least: int, most: int) -> None:
    """Give the group of every rank cgroup the sum of its ranks' CPU weights.

    The scheduler weighs a cgroup as one entity against its siblings: at the default weight
    (one task's), every contained rank of the node together got what one busy host process
    gets, and a busy rank took its share from its neighbours in the same group instead of
    from the node (docs/adr/0030: measured). With the sum of its ranks' weights (one CPU's
    per ``cpus_per_worker``), each rank competes with the node's other processes as its
    reserved CPUs' worth of busy threads would, and one more rank adds its weight rather
    than dividing the others'. Recomputed when a rank cgroup is made or removed (a dead
    one counts until it is swept).
    """
    total = 0
    with contextlib.suppress(OSError):
        for child in group.iterdir():
            if child.is_dir():
                total += _read_int(child / name)
    with contextlib.suppress(OSError):  # a group another writer just changed: next time
        _write(group / name, max(least, min(most, total)))


def _cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.extend(range(int(low), int(high) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def _write(path: Path, value: object) -> None:
    path.write_text(str(value))


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _field(path: Path, key: str) -> int:
    """The number after ``key`` in a flat-keyed cgroup file (memory.events, cpu.stat...)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _kill_all(procs: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        for pid in procs.read_text().split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), 9)
