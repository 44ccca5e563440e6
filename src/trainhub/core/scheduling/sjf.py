"""Shortest job first with known durations: a lower bound on average completion time.

Non-preemptive and greedy: at every pass, queued trials start in order of expected duration
(then submission) wherever they fit; a trial that does not fit is skipped, not waited for. With
exact durations this is the classic bound that no scheduler without that knowledge can beat on
average job completion time; it may delay large gangs without limit, which is why it is a
baseline and not a policy for production. Trials without an expected duration go last.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import DecisionList, Reason, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.queue import OrderKey, QueueOrder, TrialQueue, shape_of
from trainhub.core.scheduling.reasons import ReasonBook
from trainhub.core.scheduling.snapshot import QueuedTrial, Snapshot


def _shortest_key(trial: QueuedTrial) -> OrderKey:
    duration = trial.expected_duration_s
    return (math.inf if duration is None else duration, trial.submitted_at, trial.trial_id)


SHORTEST_FIRST_ORDER = QueueOrder("shortest-first", _shortest_key)


class ShortestJobFirstPolicy(BasePolicy):
    name = "sjf"
    queue_order = SHORTEST_FIRST_ORDER
    reads_running_durations = False

    def decide(self, snapshot: Snapshot) -> DecisionList:
        queue = TrialQueue.coerce(snapshot.queue, self.queue_order)
        groups = queue.groups
        key = self.queue_order.key
        pool = NodePool(snapshot.nodes)
        book = ReasonBook(snapshot.nodes, pool)
        starts: list[Start] = []
        lazy: list[tuple[Sequence[QueuedTrial], int, Reason]] = []
        heap = [(trials.first_key, name, 0) for name, trials in groups.items()]
        heapq.heapify(heap)
        # free GPUs say nothing about trials without GPUs: never stop early when some wait
        gpu_less = any(not group.shape.gpus_per_worker for group in groups)
        while heap and (gpu_less or pool.total_free > 0):
            _, name, at = heapq.heappop(heap)
            trials = groups[name]
            trial = trials[at]
            ranks = pool.place(trial.request)
            if ranks is None:
                # the rest of the group has the same shape and does not fit either
                fits = pool.fits_empty(trial.request, shape_of(trial.request))
                lazy.append((trials, at, book.busy if fits else book.never))
                continue
            starts.append(Start(trial.trial_id, ranks))
            pool.take(trial.request, ranks)
            book.started(trial.request, ranks)
            if at + 1 < len(trials):
                heapq.heappush(heap, (key(trials[at + 1]), name, at + 1))
        for _, name, at in heap:
            lazy.append((groups[name], at, book.waiting))
        return DecisionList(starts, (), (), lazy)
