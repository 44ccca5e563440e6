"""First in, first out with gang semantics: the head of the queue blocks those behind it."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import DecisionList, Reason, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.queue import TrialQueue
from trainhub.core.scheduling.reasons import ReasonBook
from trainhub.core.scheduling.snapshot import QueuedTrial, Snapshot


class FifoPolicy(BasePolicy):
    """Start queued trials in submission order while they fit.

    A trial that can never fit the cluster is passed over (with a reason saying so) instead of
    blocking the queue forever; any other trial that does not fit blocks everyone behind it.
    The pass walks the queue groups' heads in order and stops at the blocker, so its cost does
    not grow with the length of the queue behind it.
    """

    name = "fifo"
    reads_queued_durations = False
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
        behind = ""
        while heap:
            _, name, at = heapq.heappop(heap)
            trials = groups[name]
            trial = trials[at]
            request = trial.request
            ranks = pool.place(request)
            if ranks is not None:
                starts.append(Start(trial.trial_id, ranks))
                pool.take(request, ranks)
                book.started(request, ranks)
                if at + 1 < len(trials):
                    heapq.heappush(heap, (key(trials[at + 1]), name, at + 1))
                continue
            shape = name.shape
            if not pool.fits_empty(request, shape):
                # the whole group has this shape: none of it can ever run
                lazy.append((trials, at, book.of_group("never", request, shape)))
                continue
            behind = f"waiting behind trial {trial.trial_id} (FIFO order)"
            lazy.append(((trial,), 0, book.of_group("busy", request, shape)))
            lazy.append((trials, at + 1, behind))
            break
        for _, name, at in heap:
            trials = groups[name]
            lazy.append((trials, at, book.unless_never(trials[at].request, name.shape, behind)))
        return DecisionList(starts, (), (), lazy)
