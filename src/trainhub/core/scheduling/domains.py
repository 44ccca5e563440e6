"""The domains of one topology level (core/topology.py) and the usable GPUs of each, kept in step.

A gang that asks for a rack needs to know which racks have room: walking the cluster's nodes
for that on every pass costs the size of the cluster. A :class:`DomainIndex` groups the alive
nodes of one level by domain once and then follows the moves of their usable GPUs, so the
question costs the number of domains.

A :class:`~trainhub.core.scheduling.nodetable.NodeTable` keeps one per level asked for so far
and carries it from table to table; a
:class:`~trainhub.core.scheduling.nodepool.NodePool` copies it and keeps its copy in step with
the pass's changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trainhub.core.resources import Node
from trainhub.core.topology import UNKNOWN, domain_of


class DomainIndex:
    """The alive nodes of one level by domain (``unknown``: no label) and each domain's
    usable GPUs."""

    __slots__ = ("domain_of_node", "free", "level", "members")

    def __init__(
        self,
        level: str,
        members: dict[str, list[str]],
        domain_of_node: dict[str, str],
        free: dict[str, int],
    ) -> None:
        self.level = level
        # fixed for a set of nodes and their labels: shared by copies
        self.members = members
        self.domain_of_node = domain_of_node
        # the usable GPUs of each domain: each copy its own
        self.free = free

    @classmethod
    def build(
        cls, level: str, nodes: Mapping[str, Node], usable: Callable[[str], int]
    ) -> DomainIndex:
        """The index of ``nodes`` (the alive ones) at ``level``, with ``usable(node_id)``
        GPUs on each node."""
        members: dict[str, list[str]] = {}
        domain_of_node: dict[str, str] = {}
        free: dict[str, int] = {}
        for node_id, node in nodes.items():
            name = domain_of(node.labels, level)
            members.setdefault(name, []).append(node_id)
            domain_of_node[node_id] = name
            free[name] = free.get(name, 0) + usable(node_id)
        return cls(level, members, domain_of_node, free)

    def copy(self) -> DomainIndex:
        """The same domains, with usable GPUs that move apart from this index's."""
        return DomainIndex(self.level, self.members, self.domain_of_node, dict(self.free))

    def moved(self, node_id: str, change: int) -> None:
        """The node's usable GPUs went up (or down) by ``change``."""
        self.free[self.domain_of_node[node_id]] += change

    def fitting(self, need: int) -> list[tuple[int, str]]:
        """(usable GPUs, domain) of the labelled domains with at least ``need`` usable GPUs,
        tightest first (best fit; the name breaks ties)."""
        fits = [(free, name) for name, free in self.free.items() if free >= need]
        return sorted(item for item in fits if item[1] != UNKNOWN)
