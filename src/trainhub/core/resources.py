"""Cluster capacity and resource requests, as plain values.

A *slot* is one GPU, or one CPU core on a CPU-only cluster; quotas and usage count slots.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from trainhub.core.spec import Placement, Resources
from trainhub.core.topology import UNKNOWN, TopologyNeed, domain_of


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
    # alive but taking no new trials (cordoned, draining or unhealthy): counted as not alive
    # for placement; kept apart so a queue reason can say "cordoned" rather than "never"
    cordoned: bool = False
    # why it takes no new trials, in words ("cordoned", "draining", "unhealthy"); "" reads
    # as "cordoned"
    held: str = ""
    # host memory in GB; infinite where unknown (a node that reports none limits nothing)
    total_memory_gb: float = math.inf
    free_memory_gb: float = math.inf
    # as the cluster engine names the machine; None where it does not say
    hostname: str | None = None

    def fits(self, request: ResourceRequest, free: bool = True) -> int:
        """How many ranks of ``request`` this node can hold (free or total capacity)."""
        if not self.alive or (
            request.node_labels and not request.labels_match(self.labels, self.gpu_model)
        ):
            return 0
        gpus = self.free_gpus if free else self.total_gpus
        cpus = self.free_cpus if free else self.total_cpus
        by_gpu = gpus // request.gpus_per_worker if request.gpus_per_worker else 10**9
        # a tiny epsilon: 0.1 * 3 CPUs must fit in 0.3 CPUs
        by_cpu = int((cpus + 1e-9) // request.cpus_per_worker) if request.cpus_per_worker else 10**9
        by_mem = 10**9
        if request.memory_gb_per_worker:
            memory = self.free_memory_gb if free else self.total_memory_gb
            if math.isfinite(memory):
                by_mem = int((memory + 1e-9) // request.memory_gb_per_worker)
        return request.whole_groups(max(0, min(by_gpu, by_cpu, by_mem)))


@dataclass(frozen=True)
class ResourceRequest:
    """What a trial's gang needs: ``num_workers`` ranks of identical shape."""

    num_workers: int
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    placement: Placement = Placement.PACK
    single_node: bool = False
    node_labels: Mapping[str, str] = field(default_factory=dict)
    # host memory per rank in GB; 0 asks for none (the spec left it out)
    memory_gb_per_worker: float = 0.0
    # one rack or block, required or preferred (core/topology.py); None: anywhere
    topology: TopologyNeed | None = None
    # ranks come in groups of this many consecutive ranks that share one node: a tensor-parallel
    # group (``distributed.tensor``) talks in every layer; pipeline stages and data-parallel
    # replicas may span nodes (issue 28). A node holds whole groups only.
    group_size: int = 1

    @classmethod
    def from_spec(cls, resources: Resources, group_size: int = 1) -> ResourceRequest:
        """The request of ``resources``; ``group_size``: the spec's ``distributed.tensor``."""
        return cls(
            num_workers=resources.workers,
            gpus_per_worker=resources.gpus_per_worker,
            cpus_per_worker=resources.cpus_per_worker,
            placement=resources.placement,
            single_node=resources.single_node,
            node_labels=dict(resources.node_labels),
            memory_gb_per_worker=resources.memory_gb_per_worker or 0.0,
            topology=_topology_need(resources),
            group_size=group_size,
        )

    @cached_property
    def num_slots(self) -> int:
        """Slots this request occupies: GPUs, or whole CPU cores when it uses no GPU (computed
        once: schedulers read it in their inner loops)."""
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
        if self.memory_gb_per_worker:
            per += f" + {self.memory_gb_per_worker:g} GB"
        text = f"{self.num_workers} worker(s) x {per}"
        if self.single_node:
            text += " on one node"
        if self.node_labels:
            text += " with labels " + ", ".join(f"{k}={v}" for k, v in self.node_labels.items())
        if self.group_size > 1:
            text += f" in groups of {self.group_size} per node"
        if self.topology is not None:
            text += " " + self.topology.describe()
        return text

    def whole_groups(self, ranks: int) -> int:
        """The most of ``ranks`` that are whole groups (what a node may hold of them)."""
        return ranks - ranks % self.group_size if self.group_size > 1 else ranks


def _topology_need(resources: Resources) -> TopologyNeed | None:
    topology = resources.topology
    if topology is None:
        return None
    if topology.required is not None:
        return TopologyNeed(topology.required.value, True)
    if topology.preferred is not None:
        return TopologyNeed(topology.preferred.value, False)
    return None


@dataclass(frozen=True)
class NodeCapacity:
    """What the largest node of a cluster holds when empty."""

    gpus: int
    cpus: float
    memory_gb: float

    def describe(self) -> str:
        finite = math.isfinite(self.memory_gb)
        memory = f", {round(self.memory_gb, 1):g} GB memory" if finite else ""
        return f"{self.gpus} GPUs, {self.cpus:g} CPUs{memory}"


@dataclass(frozen=True)
class Unfittable:
    """Why a request can never run on a cluster: the spec field to change, and the message."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


def total_slots(nodes: Iterable[Node]) -> int:
    """Slots of the alive nodes: their GPUs, or their whole CPUs on a CPU-only cluster (what
    ``NodePool.total_slots`` counts, from plain nodes)."""
    alive = [n for n in nodes if n.alive]
    gpus = sum(n.total_gpus for n in alive)
    return gpus if gpus else sum(int(n.total_cpus) for n in alive)


def largest_node_capacity(nodes: Iterable[Node]) -> NodeCapacity | None:
    """The largest alive node (most GPUs, then CPUs, then memory); None without one."""
    alive = [n for n in nodes if n.alive]
    if not alive:
        return None
    best = max(alive, key=lambda n: (n.total_gpus, n.total_cpus, n.total_memory_gb))
    return NodeCapacity(best.total_gpus, best.total_cpus, best.total_memory_gb)


def can_ever_fit(request: ResourceRequest, nodes: Iterable[Node]) -> Unfittable | None:
    """None when ``request`` fits the cluster when nothing runs; else why it never will.

    Pure and cheap (one pass over the nodes); the submit path calls it to refuse a trial at
    once with the spec field to change and the largest node's capacity, and the scheduler to
    tell "never" from "later".
    """
    alive = [n for n in nodes if n.alive]
    if not alive:
        return Unfittable("resources", "the cluster has no alive node")
    largest = largest_node_capacity(alive)
    assert largest is not None
    where = f"the largest node has {largest.describe()}"
    matching = [n for n in alive if request.labels_match(n.labels, n.gpu_model)]
    if not matching:
        labels = ", ".join(f"{k}={v}" for k, v in request.node_labels.items())
        return Unfittable("resources.node_labels", f"no node has the labels {labels}")
    per_worker = (
        ("resources.gpus_per_worker", request.gpus_per_worker, "total_gpus", "GPU(s)"),
        ("resources.cpus_per_worker", request.cpus_per_worker, "total_cpus", "CPU(s)"),
        ("resources.memory_gb_per_worker", request.memory_gb_per_worker, "total_memory_gb", "GB"),
    )
    for path, wanted, attribute, unit in per_worker:
        if wanted and all(getattr(n, attribute) + 1e-9 < wanted for n in matching):
            return Unfittable(path, f"asks for {wanted:g} {unit} per worker; {where}")
    topology = _topology_unfit(request, matching)
    if topology is not None:
        return topology
    rooms = [n.fits(request, free=False) for n in matching]
    if max(rooms) < 1:
        return Unfittable("resources", f"no node holds one worker of {request.describe()}; {where}")
    if request.single_node and max(rooms) < request.num_workers:
        return Unfittable(
            "resources.workers",
            f"asks for {request.num_workers} workers on one node; a node holds at most "
            f"{max(rooms)} of {request.describe()} ({where})",
        )
    if sum(rooms) < request.num_workers:
        return Unfittable(
            "resources.workers",
            f"asks for {request.num_workers} workers; the whole cluster holds at most "
            f"{sum(rooms)} of {request.describe()}",
        )
    return None


def _topology_unfit(request: ResourceRequest, nodes: Sequence[Node]) -> Unfittable | None:
    """A level no node carries; a required level no domain could ever hold the gang in."""
    need = request.topology
    if need is None:
        return None
    path = f"resources.topology.{'required' if need.required else 'preferred'}"
    domains: dict[str, int] = {}
    for n in nodes:
        name = domain_of(n.labels, need.level)
        if name != UNKNOWN:
            domains[name] = domains.get(name, 0) + n.fits(request, free=False)
    if not domains:
        return Unfittable(
            path,
            f"no node carries the level {need.level}: label the nodes "
            f"(`trainhub nodes label NODE {need.level}=NAME`) or leave topology out",
        )
    if need.required and max(domains.values()) < request.num_workers:
        best = max(domains.items(), key=lambda item: item[1])
        return Unfittable(
            path,
            f"asks for {request.num_workers} workers of {request.describe()}; the largest "
            f"{need.level} ({best[0]}) holds at most {best[1]} (ask for fewer workers, or "
            f"preferred: {need.level})",
        )
    return None
