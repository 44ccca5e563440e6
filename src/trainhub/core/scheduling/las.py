"""Tiresias-style discretised two-dimensional least-attained-service (2D-LAS).

Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning" (NSDI 2019): a job's
attained service is GPUs x time run so far (two dimensions: how wide and how long). Jobs sit in
``len(thresholds_slot_s) + 1`` priority queues: queue i holds jobs whose attained service is
below threshold i. Lower queues go first; inside a queue, first come first served. Durations
are not needed: short jobs finish while still in the first queue, long ones sink.

Each pass admits jobs, running and queued alike, in that order while their GPUs add up to the
cluster; a running job that is not admitted is preempted when an admitted queued job needs its
room. A job waiting longer than ``promote_factor`` times its run so far is promoted to the first
queue (Tiresias' starvation knob). Two documented departures: inside a lower queue the queued
jobs are ordered by promotion time (so that only the head of each level needs checking), and a
promoted job keeps its attained service once it runs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from trainhub.core.resources import ResourceRequest
from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import DecisionList, Pending, Preempt, Reason, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.queue import OrderKey, QueueOrder, Run, RunView, TrialQueue, shape_of
from trainhub.core.scheduling.reasons import ReasonBook
from trainhub.core.scheduling.snapshot import QueuedTrial, RunningTrial, Snapshot


@dataclass(frozen=True)
class LasConfig:
    """Knobs of :class:`LeastAttainedServicePolicy`.

    Attributes:
        thresholds_slot_s: attained service (GPU-seconds) that ends each queue, increasing.
        promote_factor: promote a waiting job to the first queue once it waited this many times
            its run time so far; 0 turns promotion off.
        min_run_time_s: a job is not preempted before it ran this long in its attempt (not in
            Tiresias; the same protection the fair policy gives, so the baselines compare on
            scheduling rather than on churn).
    """

    thresholds_slot_s: tuple[float, ...] = (3600.0, 36000.0)
    promote_factor: float = 8.0
    min_run_time_s: float = 600.0

    def __post_init__(self) -> None:
        if any(t <= 0 or not math.isfinite(t) for t in self.thresholds_slot_s):
            raise ValueError(f"thresholds_slot_s must be positive, got {self.thresholds_slot_s}")
        if list(self.thresholds_slot_s) != sorted(set(self.thresholds_slot_s)):
            raise ValueError(
                f"thresholds_slot_s must be strictly increasing, got {self.thresholds_slot_s}"
            )
        if self.promote_factor < 0 or self.min_run_time_s < 0:
            raise ValueError("promote_factor and min_run_time_s must be >= 0")


class LeastAttainedServicePolicy(BasePolicy):
    name = "las"

    def __init__(self, config: LasConfig | None = None) -> None:
        self.config = config or LasConfig()
        self.queue_order = QueueOrder("2d-las", self._order_key)
        # caches that never change an answer: per running trial the times it sinks a queue;
        # per queue group its level segments
        self._crossings: dict[int, tuple[RunningTrial, tuple[float, ...]]] = {}
        self._cuts: dict[int, tuple[Run, list[RunView]]] = {}

    def level(self, attained_slot_s: float) -> int:
        return bisect.bisect_right(self.config.thresholds_slot_s, attained_slot_s)

    def _promote_at(self, trial: QueuedTrial) -> float:
        if not self.config.promote_factor or not trial.request.num_slots:
            return math.inf
        executed_s = trial.attained_service / trial.request.num_slots
        return trial.queued_at + self.config.promote_factor * executed_s

    def _order_key(self, trial: QueuedTrial) -> OrderKey:
        level = self.level(trial.attained_service)
        if level == 0:
            return (0.0, trial.submitted_at, trial.trial_id)
        return (float(level), self._promote_at(trial), trial.trial_id)

    def _queued_rank(self, trial: QueuedTrial, now: float) -> tuple[float, float, int]:
        level = self.level(trial.attained_service)
        if level and now >= self._promote_at(trial):
            level = 0
        return (float(level), trial.submitted_at, trial.trial_id)

    def _segments(self, queue: TrialQueue) -> list[RunView]:
        """Each group cut by queue level: inside a level the order is first-come (level 0) or
        promotion time (lower levels), so each segment's head is its next candidate."""
        levels = len(self.config.thresholds_slot_s) + 1
        segments: list[RunView] = []
        cuts: dict[int, tuple[Run, list[RunView]]] = {}
        for trials in queue.groups.values():
            cached = self._cuts.get(id(trials))
            if cached is None or cached[0] is not trials:
                bounds = [trials.bisect_left((float(level),)) for level in range(1, levels)]
                edges = [0, *bounds, len(trials)]
                views = [trials.view(lo, hi) for lo, hi in pairwise(edges) if hi > lo]
                cached = (trials, views)
            cuts[id(trials)] = cached
            segments.extend(cached[1])
        self._cuts = cuts
        return segments

    def _running_order(
        self, running: Sequence[RunningTrial], now: float
    ) -> tuple[list[tuple[float, float, int, RunningTrial]], list[tuple[float, int]]]:
        """Running jobs by (level now, submitted, id), and (next sink time, next level) of
        each."""
        thresholds = self.config.thresholds_slot_s
        cache = self._crossings
        fresh: dict[int, tuple[RunningTrial, tuple[float, ...]]] = {}
        order: list[tuple[float, float, int, RunningTrial]] = []
        sinks: list[tuple[float, int]] = []
        for trial in running:
            if trial.preempting:
                continue
            known = cache.get(trial.trial_id)
            if known is None or known[0] is not trial:
                slots = trial.request.num_slots
                times = tuple(
                    trial.started_at + (limit - trial.attained_service) / slots
                    if slots
                    else math.inf
                    for limit in thresholds
                )
                known = (trial, times)
            fresh[trial.trial_id] = known
            level = bisect.bisect_right(known[1], now)
            order.append((float(level), trial.submitted_at, trial.trial_id, trial))
            if level < len(thresholds):
                sinks.append((known[1][level], level + 1))
        self._crossings = fresh
        order.sort(key=lambda item: item[:3])
        return order, sinks

    def decide(self, snapshot: Snapshot) -> DecisionList:
        now = snapshot.now
        queue = TrialQueue.coerce(snapshot.queue, self.queue_order)
        segments = self._segments(queue)
        pool = NodePool(snapshot.nodes)
        book = ReasonBook(snapshot.nodes, pool)
        # slots by kind: GPUs for trials that use them, CPU cores for those that do not
        budget = [
            sum(n.total_gpus for n in pool.nodes.values()),
            sum(int(n.total_cpus) for n in pool.nodes.values()),
        ]
        running, sinks = self._running_order(snapshot.running, now)
        heap = [(self._queued_rank(seg[0], now), i, 0) for i, seg in enumerate(segments)]
        heapq.heapify(heap)
        admitted: list[QueuedTrial] = []
        lazy: list[tuple[Sequence[QueuedTrial], int, Reason]] = []
        evictable: list[RunningTrial] = []
        at_run = 0
        while at_run < len(running) or heap:
            take_running = at_run < len(running) and (not heap or running[at_run][:3] <= heap[0][0])
            if take_running:
                trial = running[at_run][3]
                at_run += 1
                slots, kind = trial.request.num_slots, _kind(trial.request)
                if budget[kind] >= slots or not trial.preemptible:
                    budget[kind] -= slots
                elif now - trial.started_at >= self.config.min_run_time_s:
                    evictable.append(trial)
                else:
                    budget[kind] -= slots
                continue
            _, index, at = heapq.heappop(heap)
            trials = segments[index]
            queued = trials[at]
            slots, kind = queued.request.num_slots, _kind(queued.request)
            if budget[kind] >= slots:
                budget[kind] -= slots
                admitted.append(queued)
                if at + 1 < len(trials):
                    rank = self._queued_rank(trials[at + 1], now)
                    heapq.heappush(heap, (rank, index, at + 1))
            else:
                lazy.append((trials, at, book.waiting))
        starts: list[Start] = []
        pending: list[Pending] = []
        blocked = False
        for queued in admitted:
            ranks = pool.place(queued.request)
            if ranks is None:
                if not pool.fits_empty(queued.request, shape_of(queued.request)):
                    lazy.append(((queued,), 0, book.never))
                    continue
                blocked = True
                # why it does not fit (GPUs, CPUs or memory), against the nodes after the pass
                lazy.append(((queued,), 0, book.prefixed("admitted by attained service")))
                continue
            starts.append(Start(queued.trial_id, ranks))
            pool.take(queued.request, ranks)
            book.started(queued.request, ranks)
        preempts = [
            Preempt(t.trial_id, "a job with less attained service needs its GPUs")
            for t in evictable
            if blocked
        ]
        return DecisionList(
            starts, preempts, pending, lazy, self._wake_at(snapshot, segments, sinks)
        )

    def _wake_at(
        self,
        snapshot: Snapshot,
        segments: Sequence[RunView],
        sinks: list[tuple[float, int]],
    ) -> float | None:
        """When the order can change although nothing happens: a running job sinks to a
        queue where a waiting job would outrank it, a queued job gets promoted, a running job
        passes its minimum run time."""
        if not segments:
            return None
        now = snapshot.now
        wake = math.inf
        heads = [(self.level(seg[0].attained_service), seg[0]) for seg in segments]
        best_waiting = min(level for level, _ in heads)
        for at, level in sinks:
            if level >= best_waiting and at < wake:
                wake = at
        for level, head in heads:
            promote_at = self._promote_at(head)
            if level and now < promote_at < wake:
                wake = promote_at
        if self.config.min_run_time_s:
            for trial in snapshot.running:
                free_at = trial.started_at + self.config.min_run_time_s
                if now < free_at < wake:
                    wake = free_at
        return None if math.isinf(wake) else wake + 1e-6


def _kind(request: ResourceRequest) -> int:
    """Which slot budget a request draws on: 0 for GPUs, 1 for CPU cores (no GPU)."""
    return 0 if request.gpus_per_worker else 1
