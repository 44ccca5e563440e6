"""One node's sample: psutil for CPU, memory, network, disk and trial process trees; NVML GPUs."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from trainhub.adapters.monitor.nvml import GpuProbe
from trainhub.adapters.ray_executor.warm_pool import registered_ranks, warm_rank_environment
from trainhub.runtime.protocol import ENV_TRIAL_ID
from trainhub.service.monitoring import NodeInventory, NodeSample

_GB = 1024**3
TRIAL_ENV = ENV_TRIAL_ID


class NodeSampler:
    """Samples this machine; cheap enough to run every few seconds (benchmarks/agent.py)."""

    def __init__(self, node_id: str, disk_path: str = "/", gpus: GpuProbe | None = None) -> None:
        self.node_id = node_id
        self.disk_path = disk_path
        self.gpus = gpus if gpus is not None else GpuProbe()
        psutil.cpu_percent(None)  # the first call starts the interval the next one measures
        # rank process id -> trial id: a process's environment is read once
        self._trial_of: dict[int, int | None] = {}
        self._warm_of: dict[int, int] = {}  # warm ranks' processes, found anew every sample

    def sample(self) -> NodeSample:
        memory = psutil.virtual_memory()
        net = psutil.net_io_counters()
        trials = self._trial_usage()
        return NodeSample(
            node_id=self.node_id,
            at=time.time(),
            cpu_pct=psutil.cpu_percent(None),
            memory_used_gb=(memory.total - memory.available) / _GB,
            memory_total_gb=memory.total / _GB,
            net_sent_bytes=net.bytes_sent if net else 0,
            net_recv_bytes=net.bytes_recv if net else 0,
            disk_used_pct=psutil.disk_usage(self.disk_path).percent,
            gpus=self.gpus.sample(self._trial_of_pid),
            trials=trials,
        )

    def _trial_usage(self) -> dict[int, tuple[float, float]]:
        """CPU % and resident GB of each trial's rank processes (found by their environment;
        a warm rank's, which is the zygote's, by the zygote's registry: warm_pool.py)."""
        usage: dict[int, tuple[float, float]] = {}
        seen = set()
        warm = registered_ranks()
        self._warm_of = {}
        for proc in psutil.process_iter(["pid"]):
            pid = proc.pid
            seen.add(pid)
            if pid not in self._trial_of:
                try:
                    value = proc.environ().get(TRIAL_ENV)
                    self._trial_of[pid] = int(value) if value and value.isdigit() else None
                except (psutil.Error, OSError):
                    self._trial_of[pid] = None
            trial = self._trial_of[pid]
            if trial is None and warm:  # an idle warm process may have become a rank since
                value = (warm_rank_environment(pid, warm) or {}).get(TRIAL_ENV)
                trial = int(value) if value and value.isdigit() else None
                if trial is not None:
                    self._warm_of[pid] = trial
            if trial is None:
                continue
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss / _GB
            except psutil.Error:
                continue
            before = usage.get(trial, (0.0, 0.0))
            usage[trial] = (before[0] + cpu, before[1] + rss)
        self._trial_of = {p: t for p, t in self._trial_of.items() if p in seen}
        return usage

    def _trial_of_pid(self, pid: int) -> int | None:
        found = self._trial_of.get(pid)
        return found if found is not None else self._warm_of.get(pid)

    def inventory(self) -> NodeInventory:
        stats = psutil.net_if_stats()
        nics = []
        for name, addresses in psutil.net_if_addrs().items():
            if name == "lo":
                continue
            ipv4 = [a.address for a in addresses if a.family == socket.AF_INET]
            stat = stats.get(name)
            nics.append(
                {
                    "name": name,
                    "speed_mbps": str(stat.speed if stat else 0),
                    "address": ipv4[0] if ipv4 else "",
                }
            )
        return NodeInventory(
            node_id=self.node_id,
            hostname=socket.gethostname(),
            cpu_model=_cpu_model(),
            num_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 0,
            memory_gb=round(psutil.virtual_memory().total / _GB, 1),
            gpus=self.gpus.inventory(),
            nics=tuple(nics),
            labels=configured_labels(),
        )


LABELS_ENV = "TRAINHUB_NODE_LABELS"  # "rack=r3,block=b1" in the agent's environment
LABELS_FILE = Path("/etc/trainhub/node-labels")  # or one KEY=VALUE a line, on the node


def configured_labels(
    environ: Mapping[str, str] | None = None, path: Path = LABELS_FILE
) -> dict[str, str]:
    """The node's labels from its configuration: the file, then the environment over it (a
    malformed entry is skipped: a label is a hint to the scheduler, never a reason to stop)."""
    environ = os.environ if environ is None else environ
    pairs: list[str] = []
    with contextlib.suppress(OSError):
        pairs += path.read_text().split()
    pairs += environ.get(LABELS_ENV, "").replace(",", " ").split()
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep and key.strip() and value.strip():
            labels[key.strip()] = value.strip()
    return labels


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
