"""Gang placement: all ranks of a request on free capacity, or a reason why not.

:func:`place` is the one-shot form (one request against a tuple of nodes); a pass that places
many trials uses a :class:`~trainhub.core.scheduling.nodepool.NodePool` and the reason helpers
below. The node choice rules are written once, in ``nodepool``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C
from trainhub.core.topology import UNKNOWN, domain_of


@dataclass(frozen=True)
class NoFit:
    reason: str
    # True when the request cannot fit even an empty cluster
    never: bool = False


def place(
    request: ResourceRequest,
    nodes: Iterable[Node],
    hot_gpu_temperature_c: float | None = HOT_GPU_TEMPERATURE_C,
) -> tuple[str, ...] | NoFit:
    """Choose a node for every rank of ``request``, or say why that is impossible now."""
    listed = tuple(nodes)
    alive = [n for n in listed if n.alive]
    ranks = NodePool(alive, hot_gpu_temperature_c).place(request)
    if ranks is not None:
        return ranks
    reason = never_reason(request, listed)  # a cordoned node is named, not taken as missing
    if reason is not None:
        return NoFit(reason, never=True)
    return NoFit(busy_reason(request, alive))


def need_text(request: ResourceRequest) -> str:
    """'2 worker(s) x 8 GPU on one node (16 GPUs)': the request, then its total."""
    text = request.describe()
    if request.gpus_per_worker and request.num_workers > 1:
        text += f" ({request.num_slots} GPUs)"
    return text


def _eligible(request: ResourceRequest, nodes: Iterable[Node]) -> list[Node]:
    return [n for n in nodes if n.alive and request.labels_match(n.labels, n.gpu_model)]


def _fits_empty(request: ResourceRequest, nodes: Sequence[Node]) -> bool:
    empty = tuple(
        replace(n, free_gpus=n.total_gpus, free_cpus=n.total_cpus, free_memory_gb=n.total_memory_gb)
        for n in nodes
    )
    return NodePool(empty, None).place(request) is not None


def never_reason(request: ResourceRequest, nodes: Sequence[Node]) -> str | None:
    """Why ``request`` cannot fit even the empty cluster, or None when it can."""
    alive = [n for n in nodes if n.alive]
    empty = tuple(
        replace(n, free_gpus=n.total_gpus, free_cpus=n.total_cpus, free_memory_gb=n.total_memory_gb)
        for n in alive
    )
    if NodePool(empty, None).place(request) is not None:
        return None
    need = need_text(request)
    topology = topology_never(request, alive)
    if topology is not None:
        return f"can never run: {topology}"
    held = [n for n in nodes if n.cordoned and not n.alive]
    if held and _fits_empty(request, [*alive, *(replace(n, alive=True) for n in held)]):
        return f"waits: needs {need}; {held_text(held)}"
    eligible = _eligible(request, alive)
    if request.node_labels and not eligible:
        labels = ", ".join(f"{k}={v}" for k, v in request.node_labels.items())
        return f"can never run: needs {need}; no node has {labels}"
    if request.gpus_per_worker and not any(n.total_gpus for n in alive):
        return f"can never run: needs {need}; the cluster has no GPUs (set gpus_per_worker: 0)"
    if request.single_node:
        largest = max((n.fits(request, free=False) for n in eligible), default=0)
        return f"can never run: needs {need}; the largest node holds {largest} such worker(s)"
    total = sum(n.fits(request, free=False) for n in eligible)
    return f"can never run: needs {need}; the whole cluster holds {total} such worker(s)"


def _names(nodes: Sequence[Node]) -> str:
    names = [n.hostname or n.node_id for n in nodes[:3]]
    return ", ".join(names) + (", ..." if len(nodes) > 3 else "")


# what ends a hold, by its cause: an admin's cordon (or drain), or the node's health
_UNTIL = {
    "cordoned": "it runs once an admin uncordons {it} (`trainhub nodes uncordon NODE`)",
    "draining": "it runs once an admin uncordons {it} after the drain "
    "(`trainhub nodes uncordon NODE`)",
    "unhealthy": "it runs once {it} is healthy again (`trainhub nodes` says why not)",
}


def held_text(held: Sequence[Node]) -> str:
    """'the node it fits on is cordoned (gpu-a); it runs once an admin uncordons one ...':
    the nodes a request would fit on, grouped by why they take no new trials."""
    by_why: dict[str, list[Node]] = {}
    for node in held:
        by_why.setdefault(node.held or "cordoned", []).append(node)
    parts = [f"{why} ({_names(nodes)})" for why, nodes in by_why.items()]
    one = len(held) == 1
    head = f"the node{'' if one else 's'} it fits on {'is' if one else 'are'} " + ", ".join(parts)
    causes = [c for c in _UNTIL if any(c in why for why in by_why)]
    if len(causes) == 1:
        until = _UNTIL[causes[0]].format(it="it" if one else "one")
    else:
        until = "it runs once one takes trials again (`trainhub nodes` says why each does not)"
    return f"{head}; {until}"


@dataclass(frozen=True)
class FreeSummary:
    """Free capacity of a set of nodes, as the busy reasons quote it."""

    gpus: int
    largest_gpus: int
    cpus: float
    largest_cpus: float
    memory_gb: float = math.inf
    largest_memory_gb: float = math.inf

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> FreeSummary:
        gpus = largest_gpus = 0
        cpus = largest_cpus = 0.0
        memory = largest_memory = 0.0
        for n in nodes:
            if n.alive:
                gpus += n.free_gpus
                largest_gpus = max(largest_gpus, n.free_gpus)
                cpus += n.free_cpus
                largest_cpus = max(largest_cpus, n.free_cpus)
                memory += n.free_memory_gb
                largest_memory = max(largest_memory, n.free_memory_gb)
        return cls(gpus, largest_gpus, cpus, largest_cpus, memory, largest_memory)

    def short_of(self, request: ResourceRequest, single_node: bool) -> str | None:
        """Which of memory or CPUs is too short for ``request`` now, in words; None if neither.

        ``single_node``: the gang must fit one node, so the largest node is what counts.
        """
        k = request.num_workers
        m = request.memory_gb_per_worker
        if m and math.isfinite(self.memory_gb):
            if single_node and self.largest_memory_gb + 1e-9 < k * m:
                return (
                    f"memory: needs {k * m:g} GB on one node, largest free is "
                    f"{self.largest_memory_gb:g} GB"
                )
            if self.largest_memory_gb + 1e-9 < m or self.memory_gb + 1e-9 < k * m:
                return (
                    f"memory: needs {m:g} GB per worker, {self.memory_gb:g} GB free "
                    f"(largest {self.largest_memory_gb:g} GB)"
                )
        c = request.cpus_per_worker
        if c:
            if single_node and self.largest_cpus + 1e-9 < k * c:
                return f"CPUs: needs {k * c:g} on one node, largest free is {self.largest_cpus:g}"
            if self.largest_cpus + 1e-9 < c or self.cpus + 1e-9 < k * c:
                return f"CPUs: needs {c:g} per worker, {self.cpus:g} free"
        return None


def busy_reason(
    request: ResourceRequest, nodes: Sequence[Node], summary: FreeSummary | None = None
) -> str:
    """Why ``request`` does not fit the free capacity of ``nodes`` now (it fits when empty).

    ``summary`` (of all nodes) may stand in for ``nodes`` when the request has no labels.
    """
    if request.topology is not None and request.topology.required:
        short = topology_busy(request, nodes)
        if short is not None:
            return f"waiting for resources: {short}"
    if summary is None or request.node_labels:
        summary = FreeSummary.of(_eligible(request, nodes))
    need = f"waiting for resources: needs {need_text(request)}"
    one_node = request.single_node or request.num_workers == 1
    if request.gpus_per_worker:
        gpus_enough = (
            summary.largest_gpus >= request.num_slots
            if one_node
            else summary.gpus >= request.num_slots
        )
        short = summary.short_of(request, one_node) if gpus_enough else None
        if short is not None:
            # the GPUs are there; name the resource that is not
            return f"{need}; not enough free {short}"
        if request.single_node or (request.num_workers == 1 and request.gpus_per_worker > 1):
            return f"{need}; largest free is {summary.largest_gpus} GPUs"
        if summary.gpus >= request.num_slots:
            # enough GPUs in total: the CPUs or the per-rank shape are the problem
            return (
                f"{need}; {summary.gpus} GPUs are free but not in pieces of "
                f"{request.gpus_per_worker} with enough CPUs"
            )
        return f"{need}; {summary.gpus} GPUs free"
    short = summary.short_of(request, one_node)
    if short is not None and short.startswith("memory"):
        return f"{need}; not enough free {short}"
    if request.single_node or request.num_workers == 1:
        return f"{need}; largest free is {summary.largest_cpus:g} CPUs"
    return f"{need}; {summary.cpus:g} CPUs free"


def _unit(request: ResourceRequest) -> str:
    return "GPUs" if request.gpus_per_worker else "CPUs"


def domain_totals(request: ResourceRequest, nodes: Iterable[Node], free: bool) -> dict[str, int]:
    """Per labelled domain of the request's level: the GPUs (CPUs without GPUs) its nodes that
    qualify for ``request`` have, free or in all."""
    assert request.topology is not None
    level = request.topology.level
    totals: dict[str, int] = {}
    for n in nodes:
        if not n.alive or n.fits(request, free=free) < 1:
            if n.alive and (name := domain_of(n.labels, level)) != UNKNOWN:
                totals.setdefault(name, 0)
            continue
        name = domain_of(n.labels, level)
        if name == UNKNOWN:
            continue
        if request.gpus_per_worker:
            have = n.free_gpus if free else n.total_gpus
        else:
            have = int((n.free_cpus if free else n.total_cpus) + 1e-9)
        totals[name] = totals.get(name, 0) + have
    return totals


def topology_never(request: ResourceRequest, nodes: Sequence[Node]) -> str | None:
    """Why no domain of the level a gang requires could ever hold it; None if one could."""
    if request.topology is None:
        return None
    level = request.topology.level
    if not any(domain_of(n.labels, level) != UNKNOWN for n in nodes):
        return (
            f"needs {need_text(request)}; no node carries the level {level} "
            f"(label them: `trainhub nodes label NODE {level}=NAME`)"
        )
    if not request.topology.required:
        return None
    totals = domain_totals(request, nodes, free=False)
    largest = max(totals.values(), default=0)
    if largest < request.num_slots:
        return (
            f"needs {request.num_slots} {_unit(request)} in one {level}; the largest {level} "
            f"has {largest}"
        )
    return None


def topology_busy(request: ResourceRequest, nodes: Sequence[Node]) -> str | None:
    """'needs 16 GPUs in one rack; the best rack has 12 free' when no domain of the level a
    gang requires has room now (None when one has: the nodes' shapes are what is short)."""
    assert request.topology is not None
    level = request.topology.level
    totals = domain_totals(request, nodes, free=True)
    if not totals:
        return None
    best, free = max(totals.items(), key=lambda item: (item[1], item[0]))
    if free >= request.num_slots:
        return None
    return (
        f"needs {request.num_slots} {_unit(request)} in one {level}; the best {level} "
        f"({best}) has {free} free"
    )
