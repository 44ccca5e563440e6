"""Cluster capacity and resource requests, as plain values.

A *slot* is one GPU, or one CPU core on a CPU-only cluster; quotas and usage count slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainhub.core.spec import Placement, Resources


@dataclass(frozen=True)
class Node:
    """One machine of the cluster as the scheduler sees it at one instant."""

    node_id: str
    total_gpus: int
    total_cpus: float
    free_gpus: int
    free_cpus: float
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_model: str | None = None
    # hottest GPU on the node in degrees Celsius, when monitoring knows it
    gpu_temperature_c: float | None = None
    alive: bool = True

    def fits(self, request: ResourceRequest, free: bool = True) -> int:
        """How many ranks of ``request`` this node can hold (free or total capacity)."""
        if not self.alive or not request.labels_match(self.labels, self.gpu_model):
            return 0
        gpus = self.free_gpus if free else self.total_gpus
        cpus = self.free_cpus if free else self.total_cpus
        by_gpu = gpus // request.gpus_per_worker if request.gpus_per_worker else 10**9
        # a tiny epsilon: 0.1 * 3 CPUs must fit in 0.3 CPUs
        by_cpu = int((cpus + 1e-9) // request.cpus_per_worker) if request.cpus_per_worker else 10**9
        return max(0, min(by_gpu, by_cpu))


@dataclass(frozen=True)
class ResourceRequest:
    """What a trial's gang needs: ``num_workers`` ranks of identical shape."""

    num_workers: int
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    placement: Placement = Placement.PACK
    single_node: bool = False
    node_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, resources: Resources) -> ResourceRequest:
        return cls(
            num_workers=resources.workers,
            gpus_per_worker=resources.gpus_per_worker,
            cpus_per_worker=resources.cpus_per_worker,
            placement=resources.placement,
            single_node=resources.single_node,
            node_labels=dict(resources.node_labels),
        )

    @property
    def num_slots(self) -> int:
        """Slots this request occupies: GPUs, or whole CPU cores when it uses no GPU."""
        if self.gpus_per_worker:
            return self.num_workers * self.gpus_per_worker
        return max(1, round(self.num_workers * self.cpus_per_worker))

    def labels_match(self, labels: Mapping[str, str], gpu_model: str | None) -> bool:
        for key, value in self.node_labels.items():
            if key == "gpu_model" and gpu_model is not None:
                if gpu_model != value:
                    return False
            elif labels.get(key) != value:
                return False
        return True

    def describe(self) -> str:
        per = (
            f"{self.gpus_per_worker} GPU"
            if self.gpus_per_worker
            else f"{self.cpus_per_worker:g} CPU"
        )
        text = f"{self.num_workers} worker(s) x {per}"
        if self.single_node:
            text += " on one node"
        if self.node_labels:
            text += " with labels " + ", ".join(f"{k}={v}" for k, v in self.node_labels.items())
        return text
