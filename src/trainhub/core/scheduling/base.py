from __future__ import annotations

import abc
from collections.abc import Sequence

from trainhub.core.scheduling.decisions import Decision
from trainhub.core.scheduling.queue import SUBMISSION_ORDER, QueueOrder
from trainhub.core.scheduling.snapshot import Snapshot


class BasePolicy(abc.ABC):
    """A scheduling policy: a pure function of a snapshot.

    Contract: every queued trial of the snapshot gets exactly one ``Start`` or ``Pending``; a
    ``Start`` places all ranks of its trial (gang) on capacity that is free in the snapshot once
    the starts before it are counted; ``Preempt`` names only running trials. The same code runs
    in the control plane and in the simulator.

    ``queue_order`` says how the policy orders trials inside a queue group; a caller that keeps
    a :class:`~trainhub.core.scheduling.queue.TrialQueue` in that order as ``Snapshot.queue``
    spares the policy re-indexing the queue on every pass (the simulator does).
    """

    name: str = "base"
    queue_order: QueueOrder = SUBMISSION_ORDER
    # half-life of the tenant standings (core.entitlement) the policy reads; None: it reads none,
    # and callers keep no ledger for it
    standing_half_life_s: float | None = None
    # whose expected durations the decisions read: queued trials', running trials'. A caller
    # may leave the others' as they were made (the simulator remakes only these when the
    # server's estimates change, ``sim.estimates``); the decisions are the same either way
    reads_queued_durations: bool = True
    reads_running_durations: bool = True

    @abc.abstractmethod
    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        """Return the decisions for this instant."""
