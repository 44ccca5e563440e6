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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.domains import DomainIndex
from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C, NodeTable, PrefKey
from trainhub.core.scheduling.queue import Shape, shape_of
from trainhub.core.spec import Placement
from trainhub.core.topology import UNKNOWN

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
            # the snapshot's table, which keeps the levels a pool asks for in step across passes
            self._table: NodeTable | None = nodes
            self._domain_ranks = nodes.domain_ranks
            # the table's free GPUs are the pool's usable ones (no caps): its indexes hold
            self._domains: dict[str, DomainIndex] = {
                level: index.copy() for level, index in nodes.domains.items()
            }
            self._fits_memo: dict[tuple[str, int], list[tuple[int, str]]] = {}
            return
        table = NodeTable(nodes, hot_gpu_temperature_c)
        self.nodes = table.alive
        self.free_gpus = table.free_gpus
        self.free_cpus = table.free_cpus
        self.free_memory = table.free_memory
        self._pref = table.pref
        self._shapes = table.shapes
        self._fits_empty = table.fits_empty
        self._table = None  # built for this pool alone
        self._domain_ranks = table.domain_ranks
        size = len(table.buckets)
        buckets: list[list[PrefKey]] = [[] for _ in range(size)]
        for i in self.nodes:
            buckets[min(self.usable(i), size - 1)].append(self._pref[i])
        for bucket in buckets:
            bucket.sort()
        self._buckets = buckets
        self.total_free = sum(self.usable(i) for i in self.nodes)
        self._domains = {}
        self._fits_memo = {}

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
        new._table = self._table
        new._domain_ranks = self._domain_ranks
        new._domains = {level: index.copy() for level, index in self._domains.items()}
        new._fits_memo = {}
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

    def restrict(self, caps: Mapping[str, int]) -> None:
        """Limit some nodes further, in place: at most ``caps[node]`` more GPUs used there."""
        for node_id, cap in caps.items():
            if node_id not in self.nodes:
                continue
            before = self.usable(node_id)
            self.caps[node_id] = min(cap, self.caps.get(node_id, cap))
            self._move(node_id, before)

    def _move(self, node_id: str, before: int) -> None:
        """Re-bucket a node whose usable GPUs were ``before``."""
        after = self.usable(node_id)
        if after != before:
            key = self._pref[node_id]
            old = self._buckets[before]
            del old[bisect.bisect_left(old, key)]
            bisect.insort(self._buckets[after], key)
            self.total_free += after - before
            self._domain_moved(node_id, after - before)

    def _domain_moved(self, node_id: str, change: int) -> None:
        """Keep the usable GPUs per domain (of the levels asked for so far) in step."""
        if self._domains:
            self._fits_memo.clear()
            for index in self._domains.values():
                index.moved(node_id, change)

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
        return request.whole_groups(max(0, min(by_gpu, by_cpu)))

    # -- placement ---------------------------------------------------------------------------

    def place(self, request: ResourceRequest) -> tuple[str, ...] | None:
        """A node per rank of ``request`` on the usable capacity, or None (gang: all or none)."""
        k = request.num_workers
        if k <= 0:
            return ()
        g = request.gpus_per_worker
        if g and self.total_free < k * g:
            return None
        if request.topology is not None:
            return self._place_topology(request)
        return self._place(request, frozenset())

    # -- topology (core/topology.py) ----------------------------------------------------------

    def domains(self, level: str) -> dict[str, list[str]]:
        """The alive nodes by their domain at ``level`` (``unknown``: no label)."""
        return self._domain_index(level).members

    def _domain_index(self, level: str) -> DomainIndex:
        """The pool's index of ``level``: copied from its table, or built once per pool the
        first time a level is asked for (the table then indexes it too, for the next passes)."""
        index = self._domains.get(level)
        if index is None:
            index = DomainIndex.build(level, self.nodes, self.usable)
            self._domains[level] = index
            if self._table is not None:
                self._table.domain_index(level)
        return index

    def domain_free(self, request: ResourceRequest, members: Sequence[str]) -> int:
        """What a domain offers ``request`` now: usable GPUs (free CPUs' whole cores without
        GPUs) of its nodes that qualify."""
        if request.gpus_per_worker:
            return sum(self.usable(i) for i in members if self.room(i, request) > 0)
        return sum(int(self.free_cpus[i] + _EPS) for i in members if self.room(i, request) > 0)

    def fitting_domains(self, request: ResourceRequest) -> list[tuple[int, str]]:
        """(free, domain) of the labelled domains of the request's level that could take the
        whole gang now by their free capacity, tightest first (best fit)."""
        assert request.topology is not None
        need = request.num_slots
        level = request.topology.level
        index = self._domain_index(level)
        if request.gpus_per_worker:  # kept up to date: no walk over the nodes
            known = self._fits_memo.get((level, need))
            if known is None:  # else nothing moved since: the same domains (a copy is asked)
                known = index.fitting(need)
                self._fits_memo[(level, need)] = known
            return list(known)
        fits = []
        for name, members in index.members.items():
            if name == UNKNOWN:
                continue
            free = self.domain_free(request, members)
            if free >= need:
                fits.append((free, name))
        fits.sort()
        return fits

    def _place_topology(self, request: ResourceRequest) -> tuple[str, ...] | None:
        assert request.topology is not None
        plain = replace(request, topology=None)
        members = self.domains(request.topology.level)
        simple = plain.gpus_per_worker and plain.placement != Placement.SPREAD
        for _, name in self.fitting_domains(request):
            if simple:
                ranks = self._pack_within(plain, members[name])
            else:
                ranks = self._place(plain, frozenset(self.nodes).difference(members[name]))
            if ranks is not None:
                return ranks
        if request.topology.required:
            return None
        return self._place(plain, frozenset())

    def _pack_within(
        self, request: ResourceRequest, members: Sequence[str]
    ) -> tuple[str, ...] | None:
        """``place``'s pack rule on a few nodes (one domain): the tightest node that holds
        what is left, else the one with the most room; cool before hot, then preference."""
        rooms = {i: self.room(i, request) for i in members}
        rooms = {i: r for i, r in rooms.items() if r > 0}
        k = request.num_workers
        if sum(rooms.values()) < k:
            return None
        pref = self._pref
        if request.single_node:
            best = [i for i, r in rooms.items() if r >= k]
            if not best:
                return None
            node = min(best, key=lambda i: (pref[i].hot, self.usable(i), pref[i]))
            return (node,) * k
        ranks: list[str] = []
        left = k
        while left:
            fit = [i for i, r in rooms.items() if r >= left]
            if fit:
                node = min(fit, key=lambda i: (pref[i].hot, self.usable(i), pref[i]))
                ranks.extend([node] * left)
                break
            node = min(rooms, key=lambda i: (pref[i].hot, -self.usable(i), pref[i]))
            take = rooms.pop(node)
            ranks.extend([node] * take)
            left -= take
        return tuple(ranks)

    def _place(self, request: ResourceRequest, excluded: frozenset[str]) -> tuple[str, ...] | None:
        """``place`` on the nodes not ``excluded`` (all of them, mostly)."""
        k = request.num_workers
        g = request.gpus_per_worker
        if not g:
            return self._place_scan(request, excluded)
        if request.single_node:
            node = self._best_fit(request, k, excluded)
            return None if node is None else (node,) * k
        if request.placement == Placement.SPREAD:
            return self._spread(request, self._scan_order(request, excluded))
        ranks: list[str] = []
        used: set[str] = set(excluded)
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

    def _scan_order(
        self, request: ResourceRequest, excluded: frozenset[str] = frozenset()
    ) -> list[tuple[str, int]]:
        rooms = [(i, self.room(i, request)) for i in self.nodes if i not in excluded]
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
        step = request.group_size  # a group's ranks stay together (rooms hold whole groups)
        while len(ranks) < request.num_workers:
            for node, _ in rooms:
                if left[node] > 0 and len(ranks) < request.num_workers:
                    ranks.extend([node] * step)
                    left[node] -= step
        return tuple(ranks)

    def _place_scan(
        self, request: ResourceRequest, excluded: frozenset[str] = frozenset()
    ) -> tuple[str, ...] | None:
        # requests without GPUs are rare: order the nodes by CPU room on the spot
        rooms = self._scan_order(request, excluded)
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
        the nodes that need the fewest releases (the request must fit the empty nodes).

        A gang that requires a level gets them in one domain of it: of the domains that could
        hold it once emptied, the one with the most usable GPUs now."""
        need = request.topology
        if need is not None and need.required:
            index = self._domain_index(need.level)
            holding = self.domain_ranks_empty(request)
            best = max(
                (
                    (index.free[name], name)
                    for name, ranks in holding.items()
                    if ranks >= request.num_workers
                ),
                default=None,
            )
            if best is None:
                return ()
            plain = replace(request, topology=None)
            return self._closest(plain, self._closest_order(index.members[best[1]]))
        return self._closest(request, self._closest_order())

    def _closest_order(self, within: Sequence[str] | None = None) -> Iterator[PrefKey]:
        """The nodes (of ``within``, else all), cool before hot, those with the most usable
        GPUs (their bucket) first, then in preference order."""
        if within is not None:
            top = len(self._buckets) - 1
            keys = [self._pref[i] for i in within]
            keys.sort(key=lambda key: (key.hot, -min(self.usable(key.node_id), top), key))
            yield from keys
            return
        for hot in (0, 1):
            for free in range(len(self._buckets) - 1, -1, -1):
                yield from (key for key in self._buckets[free] if key.hot == hot)

    def _closest(self, request: ResourceRequest, order: Iterable[PrefKey]) -> tuple[str, ...]:
        k = request.num_workers
        one_node = request.single_node or k * request.gpus_per_worker <= len(self._buckets) - 1
        ranks: list[str] = []
        for key in order:
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
            self._domain_moved(node_id, after - before)

    def fits_empty(self, request: ResourceRequest, shape: Shape) -> bool:
        """Whether ``request`` fits these nodes when nothing runs (else it never will)."""
        known = self._fits_empty.get(shape)
        if known is not None:
            return known
        k = request.num_workers
        if request.topology is not None and request.topology.required:
            fits = self.largest_domain_ranks(request) >= k
        elif request.node_labels:
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

    def largest_domain_ranks(self, request: ResourceRequest) -> int:
        """The most ranks of ``request`` one labelled domain of its level holds when empty."""
        return max(self.domain_ranks_empty(request).values(), default=0)

    def domain_ranks_empty(self, request: ResourceRequest) -> dict[str, int]:
        """Per labelled domain of the request's level: the ranks of ``request`` it holds when
        empty (on one of its nodes, for a single-node gang); memoised per request shape while
        the nodes' totals and labels stay (NodeTable.domain_ranks)."""
        assert request.topology is not None
        shape = shape_of(request)
        known = self._domain_ranks.get(shape)
        if known is None:
            known = {}
            for name, members in self.domains(request.topology.level).items():
                if name == UNKNOWN:
                    continue
                rooms = [self.nodes[i].fits(request, free=False) for i in members]
                known[name] = max(rooms, default=0) if request.single_node else sum(rooms)
            self._domain_ranks[shape] = known
        return known

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
