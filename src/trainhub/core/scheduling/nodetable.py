"""The nodes of a snapshot, pre-indexed by free GPUs so that a pass does not rebuild the index.

A :class:`NodeTable` is an immutable :class:`~collections.abc.Sequence` of
:class:`~trainhub.core.resources.Node`. ``Snapshot.nodes`` may be one: a caller that changes a
few nodes between passes (the simulator) derives the next table with :meth:`NodeTable.updated`,
which shares everything the change does not touch, and a
:class:`~trainhub.core.scheduling.nodepool.NodePool` copies the index instead of building it.
A plain tuple of nodes works too; the pool then indexes it itself.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from trainhub.core.resources import Node
from trainhub.core.scheduling.domains import DomainIndex
from trainhub.core.scheduling.queue import Shape


class PrefKey(NamedTuple):
    """A node's place in the preference order: lower is preferred (plain tuple order)."""

    hot: int  # 1 when its hottest GPU is at or over the threshold
    temperature_c: float  # inf when no monitor reports it: after the known cool nodes
    node_id: str


HOT_GPU_TEMPERATURE_C = 85.0


def preference_key(node: Node, hot_gpu_temperature_c: float | None) -> PrefKey:
    """(hot, temperature, id): lower is preferred; unknown temperature after known cool ones."""
    temp = node.gpu_temperature_c
    hot = int(
        hot_gpu_temperature_c is not None and temp is not None and temp >= hot_gpu_temperature_c
    )
    return PrefKey(hot, math.inf if temp is None else temp, node.node_id)


class NodeTable(tuple[Node, ...]):
    """Alive and dead nodes in a fixed order, with alive nodes bucketed by free GPUs."""

    hot_gpu_temperature_c: float | None
    pref: dict[str, PrefKey]
    buckets: tuple[list[PrefKey], ...]
    position: dict[str, int]
    alive: dict[str, Node]
    free_gpus: dict[str, int]
    free_cpus: dict[str, float]
    free_memory: dict[str, float]
    total_free: int
    # (total GPUs, total CPUs, total memory GB) -> count of alive nodes with that shape
    shapes: Counter[tuple[int, float, float]]
    # memo of "does this request shape fit the empty cluster", valid while totals do not change
    fits_empty: dict[Shape, bool]
    # the topology levels asked for so far, by level: carried from table to table
    domains: dict[str, DomainIndex]
    # memo per request shape with a topology: the ranks each labelled domain of its level holds
    # when empty (valid, like fits_empty, while totals and labels do not change)
    domain_ranks: dict[Shape, dict[str, int]]

    def __new__(
        cls, nodes: Iterable[Node], hot_gpu_temperature_c: float | None = HOT_GPU_TEMPERATURE_C
    ) -> NodeTable:
        table = super().__new__(cls, nodes)
        table.hot_gpu_temperature_c = hot_gpu_temperature_c
        table.position = {n.node_id: i for i, n in enumerate(table)}
        alive = [n for n in table if n.alive]
        table.alive = {n.node_id: n for n in alive}
        table.free_gpus = {n.node_id: n.free_gpus for n in alive}
        table.free_cpus = {n.node_id: n.free_cpus for n in alive}
        table.free_memory = {n.node_id: n.free_memory_gb for n in alive}
        # a node that holds more than it lists (it came back smaller) frees none
        table.total_free = sum(max(0, n.free_gpus) for n in alive)
        table.pref = {n.node_id: preference_key(n, hot_gpu_temperature_c) for n in alive}
        size = max((n.total_gpus for n in alive), default=0) + 1
        buckets: tuple[list[PrefKey], ...] = tuple([] for _ in range(size))
        for n in alive:
            buckets[max(0, min(n.free_gpus, size - 1))].append(table.pref[n.node_id])
        for bucket in buckets:
            bucket.sort()
        table.buckets = buckets
        table.shapes = Counter((n.total_gpus, n.total_cpus, n.total_memory_gb) for n in alive)
        table.fits_empty = {}
        table.domains = {}
        table.domain_ranks = {}
        return table

    def domain_index(self, level: str) -> DomainIndex:
        """The alive nodes by domain at ``level`` with their free GPUs; from then on the
        tables derived from this one keep it in step."""
        index = self.domains.get(level)
        if index is None:
            free = self.free_gpus
            index = DomainIndex.build(level, self.alive, lambda node_id: max(0, free[node_id]))
            self.domains[level] = index
        return index

    def synced(self, nodes: Sequence[Node]) -> NodeTable:
        """A table of exactly ``nodes`` (the cluster read afresh), derived from this one when
        the same nodes are listed in the same order: only nodes that changed are re-indexed."""
        if len(nodes) != len(self) or any(
            a.node_id != b.node_id for a, b in zip(self, nodes, strict=True)
        ):
            return NodeTable(nodes, self.hot_gpu_temperature_c)
        changed = {b.node_id: b for a, b in zip(self, nodes, strict=True) if a is not b and a != b}
        return self.updated(changed) if changed else self

    def updated(self, changed: Mapping[str, Node]) -> NodeTable:
        """A new table where the nodes named in ``changed`` are replaced (free capacity only).

        A change of totals, liveness, temperature or labels rebuilds the index.
        """
        nodes = list(self)
        rebuild = False
        moves: list[tuple[PrefKey, int, int]] = []
        for node_id, node in changed.items():
            at = self.position[node_id]
            old = nodes[at]
            if (
                old.total_gpus != node.total_gpus
                or old.total_cpus != node.total_cpus
                or old.total_memory_gb != node.total_memory_gb
                or old.alive != node.alive
                or old.gpu_temperature_c != node.gpu_temperature_c
                or old.labels != node.labels
                or old.gpu_model != node.gpu_model
            ):
                rebuild = True
            elif old.alive and old.free_gpus != node.free_gpus:
                moves.append((self.pref[node_id], old.free_gpus, node.free_gpus))
            nodes[at] = node
        if rebuild:
            return NodeTable(nodes, self.hot_gpu_temperature_c)
        table = tuple.__new__(NodeTable, nodes)
        table.hot_gpu_temperature_c = self.hot_gpu_temperature_c
        table.position = self.position
        table.pref = self.pref
        table.shapes = self.shapes
        table.fits_empty = self.fits_empty
        table.domain_ranks = self.domain_ranks
        table.alive = dict(self.alive)
        table.free_gpus = dict(self.free_gpus)
        table.free_cpus = dict(self.free_cpus)
        table.free_memory = dict(self.free_memory)
        table.total_free = self.total_free
        for node_id, node in changed.items():
            if node.alive:
                table.alive[node_id] = node
                table.total_free += max(0, node.free_gpus) - max(0, table.free_gpus[node_id])
                table.free_gpus[node_id] = node.free_gpus
                table.free_cpus[node_id] = node.free_cpus
                table.free_memory[node_id] = node.free_memory_gb
        table.domains = {level: index.copy() for level, index in self.domains.items()}
        buckets = list(self.buckets)
        copied: set[int] = set()
        top = len(buckets) - 1
        for key, old_free, new_free in moves:
            for index in table.domains.values():
                index.moved(key.node_id, max(0, new_free) - max(0, old_free))
            before, after = max(0, min(old_free, top)), max(0, min(new_free, top))
            for free in (before, after):
                if free not in copied:
                    buckets[free] = list(buckets[free])
                    copied.add(free)
            del buckets[before][bisect.bisect_left(buckets[before], key)]
            bisect.insort(buckets[after], key)
        table.buckets = tuple(buckets)
        return table
