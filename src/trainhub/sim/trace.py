"""Job traces: what was submitted when, how long it ran, on how many GPUs, for which tenant.

Loaders for the public traces under ``../shared/traces`` (cite them when you publish numbers):

- Philly (Microsoft, via the Pollux artifact): ``philly.csv`` with
  ``timestamp,duration,num_gpus,gpu_time,cluster``; the virtual cluster is the tenant.
- Pollux workloads: ``workload-N.csv`` with ``name,time,application,num_replicas,batch_size``.
  They carry no durations (Pollux derives them from throughput models), so each application
  gets the GPU-hours of the middle of its size class in the Pollux paper's Table 1 and runs
  ``gpu_hours / num_replicas`` hours with perfect scaling: an assumption, stated as such.
- Alibaba openb (2023): pod lists with ``num_gpu, gpu_milli, cpu_milli, creation_time,
  scheduled_time, deletion_time``. A pod is one worker on one node; a fractional GPU
  (``gpu_milli < 1000``) is rounded up to a whole one (trainhub schedules whole GPUs); pods
  without GPUs and pods never scheduled are left out; the QoS class is the tenant.
- Tiresias: ``60_job.csv`` with ``job_id,num_gpu,submit_time,...,duration``; one tenant.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from trainhub.core.resources import ResourceRequest
from trainhub.core.spec import Priority
from trainhub.core.topology import TopologyNeed


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace; times in seconds from the start of the trace."""

    job_id: int
    submit_s: float
    # uninterrupted run time on num_gpus GPUs
    duration_s: float
    num_gpus: int
    tenant: str = "default"
    priority: Priority = Priority.NORMAL
    gpus_per_worker: int = 1
    cpus_per_worker: float = 0.0
    single_node: bool = False
    node_labels: dict[str, str] = field(default_factory=dict)
    memory_gb_per_worker: float = 0.0
    topology: TopologyNeed | None = None  # one rack or block, required or preferred
    # ranks per tensor-parallel group: each group's ranks share one node (issue 28)
    tensor: int = 1

    def __post_init__(self) -> None:
        if self.num_gpus < 1 or self.num_gpus % self.gpus_per_worker:
            raise ValueError(
                f"job {self.job_id}: num_gpus {self.num_gpus} must be a positive multiple of "
                f"gpus_per_worker {self.gpus_per_worker}"
            )
        if not (self.duration_s >= 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"job {self.job_id}: duration_s must be >= 0")
        if self.tensor < 1 or (self.num_gpus // self.gpus_per_worker) % self.tensor:
            raise ValueError(
                f"job {self.job_id}: its {self.num_gpus // self.gpus_per_worker} workers must "
                f"be a multiple of tensor {self.tensor}"
            )

    def request(self) -> ResourceRequest:
        return ResourceRequest(
            num_workers=self.num_gpus // self.gpus_per_worker,
            gpus_per_worker=self.gpus_per_worker,
            cpus_per_worker=self.cpus_per_worker,
            single_node=self.single_node,
            node_labels=dict(self.node_labels),
            memory_gb_per_worker=self.memory_gb_per_worker,
            topology=self.topology,
            group_size=self.tensor,
        )


def _renumber(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    """Jobs in submission order, ids 0..n-1, time 0 at the first submission."""
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    if not ordered:
        return []
    start = ordered[0].submit_s
    # every other field as it was (the topology and tensor groups of a job included)
    return [replace(j, job_id=i, submit_s=j.submit_s - start) for i, j in enumerate(ordered)]


def load_philly(path: Path, limit: int | None = None) -> list[TraceJob]:
    """The Philly-derived trace; one GPU per rank, so a gang may span nodes."""
    jobs = []
    with Path(path).open(newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            jobs.append(
                TraceJob(
                    job_id=i,
                    submit_s=datetime.fromisoformat(row["timestamp"])
                    .replace(tzinfo=UTC)
                    .timestamp(),
                    duration_s=max(1.0, float(row["duration"])),
                    num_gpus=int(row["num_gpus"]),
                    tenant=row["cluster"],
                )
            )
    jobs = _renumber(jobs)
    return jobs[:limit] if limit is not None else jobs


# GPU-hours per job: the middle of each application's size class in Pollux (OSDI'21) Table 1
# (S: 0-1, M: 1-10, L: 10-100, XL: 100-1000 GPU-hours); an assumption, see the module doc.
POLLUX_GPU_HOURS = {
    "ncf": 0.5,
    "cifar10": 0.5,
    "deepspeech2": 5.0,
    "bert": 5.0,
    "yolov3": 50.0,
    "imagenet": 500.0,
}


def load_pollux_workload(path: Path) -> list[TraceJob]:
    """A Pollux 8-hour workload; the application is the tenant."""
    jobs = []
    with Path(path).open(newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            app = row["application"]
            replicas = int(row["num_replicas"])
            hours = POLLUX_GPU_HOURS.get(app, 1.0) / replicas
            jobs.append(
                TraceJob(
                    job_id=i,
                    submit_s=float(row["time"]),
                    duration_s=hours * 3600.0,
                    num_gpus=replicas,
                    tenant=app,
                )
            )
    return _renumber(jobs)


def load_openb_pods(path: Path, limit: int | None = None) -> list[TraceJob]:
    """Alibaba openb GPU pods that ran; one single-node worker each."""
    jobs = []
    with Path(path).open(newline="") as handle:
        reader = csv.DictReader(handle)
        if "deletion_time" not in (reader.fieldnames or ()):
            raise ValueError(
                f"{path} has no creation/deletion times (only resource shapes); "
                "use openb_pod_list_default.csv or openb_pod_list_gpushare100.csv"
            )
        for i, row in enumerate(reader):
            gpus = int(row["num_gpu"])
            if gpus <= 0:
                continue
            started = row.get("scheduled_time") or ""
            ended = row.get("deletion_time") or ""
            if not started or not ended:
                continue  # never scheduled
            duration = float(ended) - float(started)
            if duration <= 0:
                continue
            jobs.append(
                TraceJob(
                    job_id=i,
                    submit_s=float(row.get("creation_time") or started),
                    duration_s=duration,
                    num_gpus=gpus,
                    tenant=row.get("qos") or "default",
                    gpus_per_worker=gpus,
                    cpus_per_worker=float(row["cpu_milli"]) / 1000.0,
                    memory_gb_per_worker=float(row.get("memory_mib") or 0) / 1024.0,
                    single_node=True,
                )
            )
    jobs = _renumber(jobs)
    return jobs[:limit] if limit is not None else jobs


def load_tiresias(path: Path) -> list[TraceJob]:
    """The 60-job Tiresias testbed workload (one tenant)."""
    jobs = []
    with Path(path).open(newline="") as handle:
        for row in csv.DictReader(handle):
            jobs.append(
                TraceJob(
                    job_id=int(row["job_id"]),
                    submit_s=float(row["submit_time"]),
                    duration_s=float(row["duration"]),
                    num_gpus=int(row["num_gpu"]),
                )
            )
    return _renumber(jobs)
