"""Free capacity during one scheduling pass, indexed so that placing a gang needs no sort.

Nodes sit in buckets by their number of free GPUs; inside a bucket they are in preference order
(cool before hot, then cooler, then node id). Placing a gang then walks at most a few buckets:

- a gang that fits on one node (always, with ``single_node``) goes to the node where it fits
  most tightly (best fit), which keeps whole nodes free for the large gangs;
- a larger ``pack`` gang takes the nodes with the most room first (fewest nodes) and the
  tightest node for its remainder;
- a ``spread`` gang puts its ranks round-robin on the coolest nodes with room, most room first.

Nodes at or above ``hot_gpu_temperature_c`` are used only when no cooler node can take the
gang; among equally good nodes the cooler GPU wins. A node of unknown temperature ranks after
the known cool ones and before the hot ones.

A pool may carry ``caps``: per node, the most GPUs that may be used on it (a reservation holds
the rest). The pool is private to one pass and is mutated as the pass starts trials.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C, NodeTable, PrefKey
from trainhub.core.scheduling.queue import Shape
from trainhub.core.spec import Placement

_EPS = 1e-9


class NodePool:
    """Mutable free capacity of the alive nodes of a snapshot (one pass only)."""

    def __init__(
        self,
        nodes: Iterable[Node],
        hot_gpu_temperature_c: float | None = HOT_GPU_TEMPERATURE_C,
        caps: Mapping[str, int] | None = None,
    ) -> None:
        self.hot_gpu_temperature_c = hot_gpu_temperature_c
        self.caps: dict[str, int] = dict(caps or {})
        if (
            isinstance(nodes, NodeTable)
            and nodes.hot_gpu_temperature_c == hot_gpu_temperature_c
            and not self.caps
        ):
            # the caller kept the index up to date: copy it (C-speed) instead of building it
            self.nodes = nodes.alive
            self.free_gpus = dict(nodes.free_gpus)
            self.free_cpus = dict(nodes.free_cpus)
            self.free_memory = dict(nodes.free_memory)
            self._pref = nodes.pref
            self._buckets = [list(bucket) for bucket in nodes.buckets]
            self.total_free = nodes.total_free
            self._shapes = nodes.shapes
            self._fits_empty = nodes.fits_empty
            return
        table = NodeTable(nodes, hot_gpu_temperature_c)
        self.nodes = table.alive
        self.free_gpus = table.free_gpus
        self.free_cpus = table.free_cpus
        self.free_memory = table.free_memory
        self._pref = table.pref
        self._shapes = table.shapes
        self._fits_empty = table.fits_empty
        size = len(table.buckets)
        buckets: list[list[PrefKey]] = [[] for _ in range(size)]
        for i in self.nodes:
            buckets[min(self.usable(i), size - 1)].append(self._pref[i])
        for bucket in buckets:
            bucket.sort()
        self._buckets = buckets
        self.total_free = sum(self.usable(i) for i in self.nodes)

    def copy(self, caps: Mapping[str, int] | None = None) -> NodePool:
        """The same free capacity, with ``caps`` (added to any) limiting some nodes."""
        new = NodePool.__new__(NodePool)
        new.hot_gpu_temperature_c = self.hot_gpu_temperature_c
        new.nodes = self.nodes
        new.free_gpus = dict(self.free_gpus)
        new.free_cpus = dict(self.free_cpus)
        new.free_memory = dict(self.free_memory)
        new._pref = self._pref
        new._shapes = self._shapes
        new._fits_empty = self._fits_empty
        new._buckets = [list(bucket) for bucket in self._buckets]
        new.total_free = self.total_free
        new.caps = dict(self.caps)
        for node_id, cap in (caps or {}).items():
            if node_id not in new.nodes:
                continue
            before = new.usable(node_id)
            new.caps[node_id] = min(cap, new.caps.get(node_id, cap))
            new._move(node_id, before)
        return new

    def _move(self, node_id: str, before: int) -> None:
        """Re-bucket a node whose usable GPUs were ``before``."""
        after = self.usable(node_id)
        if after != before:
            key = self._pref[node_id]
            old = self._buckets[before]
            del old[bisect.bisect_left(old, key)]
            bisect.insort(self._buckets[after], key)
            self.total_free += after - before

    def preference(self, node_id: str) -> tuple[int, float]:
        """(hot, temperature): lower is preferred."""
        hot, temp, _ = self._pref[node_id]
        return hot, temp

    def usable(self, node_id: str) -> int:
        """GPUs that a trial may take on the node now."""
        free = self.free_gpus[node_id]
        cap = self.caps.get(node_id)
        # a node that holds more than it lists (it came back smaller) has none, not fewer than none
        return max(0, free if cap is None else min(free, cap))

    def room(self, node_id: str, request: ResourceRequest) -> int:
        """How many ranks of ``request`` the node can take now."""
        if request.node_labels:
            node = self.nodes[node_id]
            if not request.labels_match(node.labels, node.gpu_model):
                return 0
        g = request.gpus_per_worker
        by_gpu = self.usable(node_id) // g if g else 10**9
        c = request.cpus_per_worker
        by_cpu = int((self.free_cpus[node_id] + _EPS) // c) if c else 10**9
        m = request.memory_gb_per_worker
        if m:
            memory = self.free_memory[node_id]
            if memory != math.inf:
                by_cpu = min(by_cpu, int((memory + _EPS) // m))
        return max(0, min(by_gpu, by_cpu))

    # -- placement ---------------------------------------------------------------------------

    def place(self, request: ResourceRequest) -> tuple[str, ...] | None:
        """A node per rank of ``request`` on the usable capacity, or None (gang: all or none)."""
        k = request.num_workers
        if k <= 0:
            return ()
        g = request.gpus_per_worker
        if g and self.total_free < k * g:
            return None
        if not g:
            return self._place_scan(request)
        if request.single_node:
            node = self._best_fit(request, k, ())
            return None if node is None else (node,) * k
        if request.placement == Placement.SPREAD:
            return self._spread(request, self._scan_order(request))
        ranks: list[str] = []
        used: set[str] = set()
        remaining = k
        while remaining:
            node = self._best_fit(request, remaining, used)
            if node is not None:
                ranks.extend([node] * remaining)
                break
            node = self._largest(request, used)
            if node is None:
                return None
            take = min(remaining, self.room(node, request))
            ranks.extend([node] * take)
            used.add(node)
            remaining -= take
        return tuple(ranks)

    def _best_fit(self, request: ResourceRequest, ranks: int, used: Iterable[str]) -> str | None:
        need = ranks * request.gpus_per_worker
        exclude = set(used)
        for allow_hot in (0, 1):
            for free in range(need, len(self._buckets)):
                for key in self._buckets[free]:
                    if key.hot > allow_hot:
                        break
                    if key.node_id not in exclude and self.room(key.node_id, request) >= ranks:
                        return key.node_id
        return None

    def _largest(self, request: ResourceRequest, used: set[str]) -> str | None:
        for allow_hot in (0, 1):
            for free in range(len(self._buckets) - 1, request.gpus_per_worker - 1, -1):
                for key in self._buckets[free]:
                    if key.hot > allow_hot:
                        break
                    if key.node_id not in used and self.room(key.node_id, request) > 0:
                        return key.node_id
        return None

    def _scan_order(self, request: ResourceRequest) -> list[tuple[str, int]]:
        rooms = [(i, self.room(i, request)) for i in self.nodes]
        rooms = [(i, r) for i, r in rooms if r > 0]
        rooms.sort(key=lambda item: (self.preference(item[0]), -item[1], item[0]))
        return rooms

    def _spread(
        self, request: ResourceRequest, rooms: list[tuple[str, int]]
    ) -> tuple[str, ...] | None:
        if sum(r for _, r in rooms) < request.num_workers:
            return None
        ranks: list[str] = []
        left = dict(rooms)
        while len(ranks) < request.num_workers:
            for node, _ in rooms:
                if left[node] > 0 and len(ranks) < request.num_workers:
                    ranks.append(node)
                    left[node] -= 1
        return tuple(ranks)

    def _place_scan(self, request: ResourceRequest) -> tuple[str, ...] | None:
        # requests without GPUs are rare: order the nodes by CPU room on the spot
        rooms = self._scan_order(request)
        k = request.num_workers
        if request.placement == Placement.SPREAD and not request.single_node:
            return self._spread(request, rooms)
        fitting = [(r, self._pref[i], i) for i, r in rooms if r >= k]
        if fitting:
            return (min(fitting)[2],) * k
        if request.single_node:
            return None
        ranks: list[str] = []
        for node, room in sorted(rooms, key=lambda item: (self._pref[item[0]].hot, -item[1])):
            ranks.extend([node] * min(room, k - len(ranks)))
            if len(ranks) == k:
                return tuple(ranks)
        return None

    def closest(self, request: ResourceRequest) -> tuple[str, ...]:
        """Nodes that could hold ``request`` once emptied, those with the most room now first:
        the nodes that need the fewest releases (the request must fit the empty nodes)."""
        k = request.num_workers
        one_node = request.single_node or k * request.gpus_per_worker <= len(self._buckets) - 1
        ranks: list[str] = []
        for allow_hot in (0, 1):
            for free in range(len(self._buckets) - 1, -1, -1):
                for key in self._buckets[free]:
                    if key.hot > allow_hot or (allow_hot and key.hot == 0):
                        continue
                    whole = self.nodes[key.node_id].fits(request, free=False)
                    if one_node:
                        if whole >= k:
                            return (key.node_id,) * k
                    elif whole > 0:
                        ranks.extend([key.node_id] * min(whole, k - len(ranks)))
                        if len(ranks) == k:
                            return tuple(ranks)
        return tuple(ranks) if not one_node else ()

    # -- changes -----------------------------------------------------------------------------

    def take(
        self, request: ResourceRequest, ranks: Sequence[str], against_caps: bool = True
    ) -> None:
        """Count the capacity of ``ranks`` of ``request`` as used.

        ``against_caps=False`` for a trial that leaves before the reservation behind a cap needs
        the node: it uses free GPUs now but none of the capped surplus.
        """
        counts: dict[str, int] = {}
        for node in ranks:
            counts[node] = counts.get(node, 0) + 1
        for node, count in counts.items():
            self.adjust(
                node,
                -count * request.gpus_per_worker,
                -count * request.cpus_per_worker,
                -count * request.memory_gb_per_worker,
                against_caps=against_caps,
            )

    def adjust(
        self,
        node_id: str,
        gpus: int,
        cpus: float = 0.0,
        memory_gb: float = 0.0,
        against_caps: bool = True,
    ) -> None:
        """Add (or, negative, remove) free capacity on a node."""
        if node_id not in self.nodes:
            return
        before = self.usable(node_id)
        self.free_gpus[node_id] += gpus
        self.free_cpus[node_id] += cpus
        if memory_gb:
            self.free_memory[node_id] += memory_gb
        if against_caps and node_id in self.caps and gpus < 0:
            # a cap bounds what new trials take; what they take counts against it
            self.caps[node_id] = max(0, self.caps[node_id] + gpus)
        after = self.usable(node_id)
        if after != before:
            key = self._pref[node_id]
            old = self._buckets[before]
            del old[bisect.bisect_left(old, key)]
            bisect.insort(self._buckets[min(after, len(self._buckets) - 1)], key)
            self.total_free += after - before

    def fits_empty(self, request: ResourceRequest, shape: Shape) -> bool:
        """Whether ``request`` fits these nodes when nothing runs (else it never will)."""
        known = self._fits_empty.get(shape)
        if known is not None:
            return known
        k = request.num_workers
        if request.node_labels:
            rooms = [n.fits(request, free=False) for n in self.nodes.values()]
            fits = max(rooms, default=0) >= k if request.single_node else sum(rooms) >= k
        else:
            g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
            rooms_by_shape = [
                (
                    min(
                        tg // g if g else 10**9,
                        int((tc + _EPS) // c) if c else 10**9,
                        int((tm + _EPS) // m) if m and tm != math.inf else 10**9,
                    ),
                    count,
                )
                for (tg, tc, tm), count in self._shapes.items()
            ]
            if request.single_node:
                fits = max((r for r, _ in rooms_by_shape), default=0) >= k
            else:
                fits = sum(max(0, r) * count for r, count in rooms_by_shape) >= k
        self._fits_empty[shape] = fits
        return fits

    def most_ranks_empty(self, request: ResourceRequest) -> int:
        """The most ranks of ``request`` one node holds when empty (node labels not
        considered): ``max(node.fits(request, free=False))`` over the alive nodes."""
        g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
        most = 0
        for tg, tc, tm in self._shapes:
            ranks = min(
                tg // g if g else 10**9,
                int((tc + _EPS) // c) if c else 10**9,
                int((tm + _EPS) // m) if m and math.isfinite(tm) else 10**9,
            )
            most = max(most, ranks)
        return most

    # -- views -------------------------------------------------------------------------------

    def total_slots(self) -> int:
        """Slots of the alive nodes: their GPUs, or their whole CPUs on a CPU-only cluster."""
        gpus = sum(g * count for (g, _, _), count in self._shapes.items())
        if gpus:
            return gpus
        return sum(int(c) * count for (_, c, _), count in self._shapes.items())

    def largest_free(self) -> int:
        for free in range(len(self._buckets) - 1, -1, -1):
            if self._buckets[free]:
                return free
        return 0

    def frozen(self) -> tuple[Node, ...]:
        """The nodes with the pool's free capacity (for reasons computed later)."""
        return tuple(
            replace(
                n,
                free_gpus=self.free_gpus[i],
                free_cpus=self.free_cpus[i],
                free_memory_gb=self.free_memory[i],
            )
            if n.free_gpus != self.free_gpus[i]
            or n.free_cpus != self.free_cpus[i]
            or n.free_memory_gb != self.free_memory[i]
            else n
            for i, n in self.nodes.items()
        )
