"""Idle-while-fits: GPU-time left idle while a waiting trial would fit on it.

A work-conserving scheduler never leaves a GPU idle while a waiting trial could run on it;
holding GPUs for a gang's reservation, or leaving them to a tenant's guarantee, counts as idle
here. At each state of the simulation the count is the GPUs the waiting trials could take at
once on the free capacity: per request shape, as many of its trials as the free nodes hold
(single-node gangs on one node each, others across nodes), capped by the free GPUs in all.
Shapes are counted independently of each other, so where two shapes compete for the same
free node the count is an upper bound: the measure errs against the policy, never for it.
Node labels are not checked (the traces ask for none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainhub.core.scheduling.queue import TrialQueue


class IdleWhileFits:
    """Integrates idle-while-fits GPUs over simulated time (lazily, per state change)."""

    def __init__(
        self,
        free_gpus: Mapping[str, int],
        free_cpus: Mapping[str, float],
        free_memory_gb: Mapping[str, float],
        start_s: float,
    ) -> None:
        # the simulator's own free-capacity books, read when the state is integrated
        self._free_g = free_gpus
        self._free_c = free_cpus
        self._free_m = free_memory_gb
        self._queue: TrialQueue | None = None
        self._dirty = False
        self._value = 0
        self._since = start_s
        self.idle_gpu_s = 0.0

    def changed(self, queue: TrialQueue) -> None:
        """The queue or the free capacity changed (the queue given is the current one)."""
        self._queue = queue
        self._dirty = True

    def advance(self, now: float) -> None:
        """The state since the last call held until ``now``."""
        if now <= self._since:
            return
        if self._dirty:
            self._value = self._measure()
            self._dirty = False
        self.idle_gpu_s += self._value * (now - self._since)
        self._since = now

    def _measure(self) -> int:
        queue = self._queue
        if queue is None or not len(queue):
            return 0
        free = [(g, self._free_c[i], self._free_m[i]) for i, g in self._free_g.items() if g > 0]
        if not free:
            return 0
        total_free = sum(g for g, _, _ in free)
        shapes: dict[tuple[int, float, float, bool, int], int] = {}
        for run in queue.groups.values():
            request = run.first.request
            if not request.gpus_per_worker:
                continue
            key = (
                request.gpus_per_worker,
                request.cpus_per_worker,
                request.memory_gb_per_worker,
                request.single_node,
                request.num_workers,
            )
            shapes[key] = shapes.get(key, 0) + len(run)
        idle = 0
        for (g, c, m, single, workers), count in shapes.items():
            rooms = [
                min(
                    fg // g,
                    int((fc + 1e-9) // c) if c else fg,
                    # a node that reports no memory (infinite) limits nothing
                    int((fm + 1e-9) // m) if m and math.isfinite(fm) else fg,
                )
                for fg, fc, fm in free
            ]
            placeable = sum(r // workers for r in rooms) if single else sum(rooms) // workers
            idle += min(count, placeable) * workers * g
            if idle >= total_free:
                return total_free
        return idle
