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
from typing import NamedTuple

from trainhub.core.resources import ResourceRequest
from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import DecisionList, Pending, Preempt, Reason, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.queue import (
    OrderKey,
    QueueOrder,
    Run,
    RunView,
    Shape,
    TrialQueue,
    shape_of,
)
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


# a running job's place in the order: (level, submitted, id, the job, its slot kind, the
# decision that preempts it, made once)
_Entry = tuple[float, float, int, RunningTrial, int, Preempt]


class _Ranked(NamedTuple):
    """A running job's entry, the times between which its level holds, and when it sinks
    next (with the level it sinks to)."""

    trial: RunningTrial
    entry: _Entry
    since: float
    until: float
    sink: tuple[float, int] | None


class LeastAttainedServicePolicy(BasePolicy):
    name = "las"
    reads_queued_durations = False
    reads_running_durations = False

    def __init__(self, config: LasConfig | None = None) -> None:
        self.config = config or LasConfig()
        self.queue_order = QueueOrder("2d-las", self._order_key)
        # caches that never change an answer: per running trial its place in the order while
        # its queue level holds, and the order itself; per queue group its level segments
        self._ranked: dict[int, _Ranked] = {}
        self._order: list[_Entry] = []
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
    ) -> tuple[list[_Entry], list[tuple[float, int]]]:
        """Running jobs by (level now, submitted, id), and (next sink time, next level) of
        each. The order of the last call is kept and only the jobs that started, ended or sank
        a queue since are sorted into it."""
        cache = self._ranked
        fresh: dict[int, _Ranked] = {}
        moved: list[_Entry] = []
        sinks: list[tuple[float, int]] = []
        for trial in running:
            if trial.preempting:
                continue
            known = cache.get(trial.trial_id)
            if known is None or known.trial is not trial or not known.since <= now < known.until:
                known = self._rank_running(trial, now)
                moved.append(known.entry)
            fresh[trial.trial_id] = known
            if known.sink is not None:
                sinks.append(known.sink)
        self._ranked = fresh
        order = self._order
        if moved or len(order) != len(fresh):
            get = fresh.get
            order = [e for e in order if (k := get(e[2])) is not None and k.entry is e]
            moved.sort()
            order += moved
            order.sort()  # two sorted runs: a merge; ids are unique, trials never compared
            self._order = order
        return order, sinks

    def _rank_running(self, trial: RunningTrial, now: float) -> _Ranked:
        thresholds = self.config.thresholds_slot_s
        slots = trial.request.num_slots
        times = [
            trial.started_at + (limit - trial.attained_service) / slots if slots else math.inf
            for limit in thresholds
        ]
        level = bisect.bisect_right(times, now)
        return _Ranked(
            trial,
            (
                float(level),
                trial.submitted_at,
                trial.trial_id,
                trial,
                _kind(trial.request),
                Preempt(trial.trial_id, _PREEMPT_REASON),
            ),
            times[level - 1] if level else -math.inf,
            times[level] if level < len(times) else math.inf,
            (times[level], level + 1) if level < len(times) else None,
        )

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
        # each segment walked by an iterator (indexing a chunked run trial by trial costs more)
        walks = [iter(segment) for segment in segments]
        heap: list[tuple[tuple[float, float, int], int, int, QueuedTrial]] = []
        for index, walk in enumerate(walks):
            head = next(walk)
            heap.append((self._queued_rank(head, now), index, 0, head))
        heapq.heapify(heap)
        admitted: list[tuple[QueuedTrial, int]] = []  # with its segment's index
        lazy: list[tuple[Sequence[QueuedTrial], int, Reason]] = []
        evictable: list[Preempt] = []
        old_enough = now - self.config.min_run_time_s
        at_run = 0
        spent = [False, False]  # a kind's budget below one slot: nothing more of it is admitted
        while at_run < len(running) or heap:
            # a running entry is never equal to a queued rank: their ids differ
            take_running = at_run < len(running) and (not heap or running[at_run] < heap[0][0])
            if take_running:
                _, _, _, trial, kind, preempt = running[at_run]
                at_run += 1
                slots = trial.request.num_slots
                if budget[kind] >= slots or not trial.preemptible:
                    budget[kind] -= slots
                elif trial.started_at <= old_enough:
                    evictable.append(preempt)
                else:
                    budget[kind] -= slots
            else:
                _, index, at, queued = heapq.heappop(heap)
                slots, kind = queued.request.num_slots, _kind(queued.request)
                if budget[kind] >= slots:
                    budget[kind] -= slots
                    admitted.append((queued, index))
                    following = next(walks[index], None)
                    if following is not None:
                        rank = self._queued_rank(following, now)
                        heapq.heappush(heap, (rank, index, at + 1, following))
                else:
                    lazy.append((segments[index], at, book.waiting))
            if budget[kind] < 1 and not spent[kind]:
                # the rest of this kind is decided without the merge: its queued heads wait,
                # its running trials are evictable or kept as they are
                spent[kind] = True
                rest = running[at_run:]
                running = [item for item in rest if item[4] != kind]
                at_run = 0
                evictable.extend(
                    item[5]
                    for item in rest
                    if item[4] == kind and item[3].preemptible and item[3].started_at <= old_enough
                )
                kept = []
                for entry in heap:
                    if _kind(entry[3].request) == kind:
                        lazy.append((segments[entry[1]], entry[2], book.waiting))
                    else:
                        kept.append(entry)
                heapq.heapify(kept)
                heap = kept
        starts: list[Start] = []
        pending: list[Pending] = []
        blocked = False
        # a shape that did not fit does not fit later in the pass either (the pool only fills)
        refused: dict[Shape, Reason] = {}
        shapes: dict[int, Shape] = {}  # by segment: a segment's trials share one shape
        for queued, index in admitted:
            request = queued.request
            shape = shapes.get(index)
            if shape is None:
                shape = shapes[index] = shape_of(request)
            reason = refused.get(shape)
            if reason is None:
                ranks = pool.place(request)
                if ranks is not None:
                    starts.append(Start(queued.trial_id, ranks))
                    pool.take(request, ranks)
                    book.started(request, ranks)
                    continue
                if pool.fits_empty(request, shape):
                    blocked = True
                    # why it does not fit (GPUs, CPUs or memory), against the nodes after the pass
                    reason = book.prefixed("admitted by attained service")
                else:
                    reason = book.never
                refused[shape] = reason
            lazy.append(((queued,), 0, reason))
        preempts = evictable if blocked else []
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
        if min_run := self.config.min_run_time_s:
            frees = [trial.started_at + min_run for trial in snapshot.running]
            wake = min(wake, min((at for at in frees if at > now), default=math.inf))
        return None if math.isinf(wake) else wake + 1e-6


_PREEMPT_REASON = "a job with less attained service needs its GPUs"


def _kind(request: ResourceRequest) -> int:
    """Which slot budget a request draws on: 0 for GPUs, 1 for CPU cores (no GPU)."""
    return 0 if request.gpus_per_worker else 1
