"""The reservation of the trial at the head of the queue, which backfill must not delay.

When the first trial in policy order does not fit, it gets a reservation: the nodes it will
start on and, when every trial it waits for has an expected end, the time it will start
(EASY backfill). Trials behind it may start now only where they cannot delay it:

- on nodes outside the reservation, freely;
- on a reserved node, only the GPUs the head will not need there even once the expected
  releases happened (the node's *cap*);
- anywhere, if their own expected duration ends before the reservation's start time.

The conservative rule when durations are unknown: a running trial without an expected end is
assumed never to end, and a queued trial without an expected duration is assumed to run past
any reservation. The reservation then goes to the nodes that need the fewest of those unknown
releases (the most free GPUs after the known releases), and backfill uses only GPUs that the
head will not need on them; the head starts as soon as its reserved nodes drain, which backfill
cannot postpone.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import QueuedTrial


@dataclass(frozen=True)
class Reservation:
    trial_id: int
    # node of each rank of the head when it starts
    ranks: tuple[str, ...]
    # per reserved node: the GPUs that backfill may still take there
    caps: dict[str, int]
    # expected start; None when it waits for a release of unknown time
    start_at: float | None

    def describe(self, now: float) -> str:
        nodes = len(set(self.ranks))
        text = f"next in line: {nodes} node(s) reserved"
        if self.start_at is not None:
            text += f", expected to start in {_duration(self.start_at - now)}"
        return text


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def releases(
    running: RunningTable, now: float, known_ends: bool = True
) -> list[tuple[float, str, int, float, float]]:
    """(time, node, GPUs, CPUs, memory GB) freed by running trials with a known end, in order.

    A trial being preempted is about to leave: its capacity counts as freed now. Without
    ``known_ends`` expected durations are ignored: only those trials count.
    """
    events: list[tuple[float, str, int, float, float]] = []
    ending = running.with_known_end if known_ends else ()
    for trial in (*running.preempting, *ending):
        if trial.preempting:
            end = now
        elif trial.expected_duration_s is not None:
            end = max(now, trial.started_at + trial.expected_duration_s)
        else:
            continue
        request = trial.request
        g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
        counts: dict[str, int] = {}
        for node in trial.placement:
            counts[node] = counts.get(node, 0) + 1
        events.extend((end, node, n * g, n * c, n * m) for node, n in counts.items())
    events.sort()
    return events


def reserve(
    head: QueuedTrial,
    pool: NodePool,
    running: RunningTable,
    now: float,
    *,
    known_ends: bool = True,
) -> Reservation:
    """Where and when ``head`` will start, given the known releases of ``running`` (with
    ``known_ends`` False, only those of the trials being preempted)."""
    request = head.request
    need = request.num_slots if request.gpus_per_worker else 0
    future = pool.copy()
    for time, node, gpus, cpus, memory in releases(running, now, known_ends):
        future.adjust(node, gpus, cpus, memory)
        if future.total_free >= need:
            ranks = future.place(request)
            if ranks is not None:
                return _reservation(head, ranks, future, time)
    return _reservation(head, future.closest(request), future, None)


def _reservation(
    head: QueuedTrial, ranks: tuple[str, ...], future: NodePool, start_at: float | None
) -> Reservation:
    need: dict[str, int] = {}
    for node in ranks:
        need[node] = need.get(node, 0) + head.request.gpus_per_worker
    caps = {node: max(0, future.free_gpus[node] - gpus) for node, gpus in need.items()}
    return Reservation(head.trial_id, ranks, caps, start_at)
