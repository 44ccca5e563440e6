"""The simulator's future events, in time order, and the one wake-up a policy waits for.

Arrivals are not here: they come from the sorted trace. What is here is what the simulation
itself schedules: an attempt finishing, a preempted attempt releasing its GPUs once it has
saved, and the wake-ups that run a scheduling pass when nothing else would.
"""

from __future__ import annotations

import heapq
import math
from enum import IntEnum
from typing import NamedTuple


class EventKind(IntEnum):
    FINISH = 0  # the attempt did all its remaining work: the job is done
    RELEASE = 1  # a preempted attempt has saved and exits: the job queues again
    WAKE = 2  # no job changes; a scheduling pass is due (a tick, or a policy's wake_at)


class Event(NamedTuple):
    at_s: float
    # push order: events at the same instant pop in the order they were scheduled
    seq: int
    kind: EventKind
    job_id: int  # -1 for a wake-up
    # the attempt the event belongs to: an event of an attempt that already ended is stale
    attempt: int


class EventQueue:
    """A heap of events, with wake-ups kept to the earliest one pending.

    A wake-up later than one already pending is dropped: the earlier one runs a pass, and the
    policy asks again there. ``pop_due`` consumes wake-ups itself; a pass runs after the
    events of each instant whenever something waits, so the caller only sees job events.
    """

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self._next_wake = math.inf

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_at(self) -> float:
        """The time of the earliest event; inf when there is none."""
        return self._heap[0].at_s if self._heap else math.inf

    def push(self, at_s: float, kind: EventKind, job_id: int, attempt: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, Event(at_s, self._seq, kind, job_id, attempt))

    def wake_at(self, at_s: float) -> None:
        """Run a scheduling pass at ``at_s``, unless one is already due no later."""
        if at_s < self._next_wake:
            self._next_wake = at_s
            self.push(at_s, EventKind.WAKE, -1, 0)

    def pop_due(self, now: float) -> list[Event]:
        """The job events up to ``now``, in order, removed from the queue."""
        heap = self._heap
        due: list[Event] = []
        while heap and heap[0].at_s <= now:
            event = heapq.heappop(heap)
            if event.kind is not EventKind.WAKE:
                due.append(event)
            elif self._next_wake <= now:
                self._next_wake = math.inf
        return due
