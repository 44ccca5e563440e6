"""What a policy sees: frozen values taken at one instant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainhub.core.entitlement import Standing
from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.spec import Priority


@dataclass(frozen=True)
class QueuedTrial:
    trial_id: int
    tenant: str
    request: ResourceRequest
    priority: Priority = Priority.NORMAL
    # when the trial (re-)entered the queue, in seconds of the policy's clock
    queued_at: float = 0.0
    # first submission time; queue order among equals
    submitted_at: float = 0.0
    user: str = ""
    # estimated remaining run time, when known (simulation with known durations, SJF bound)
    expected_duration_s: float | None = None
    # slot-seconds this trial has already run (least-attained-service policies)
    attained_service: float = 0.0


@dataclass(frozen=True)
class RunningTrial:
    trial_id: int
    tenant: str
    request: ResourceRequest
    # node_id of each rank
    placement: tuple[str, ...]
    priority: Priority = Priority.NORMAL
    # when this attempt started
    started_at: float = 0.0
    user: str = ""
    preemptible: bool = True
    # slot-seconds run before this attempt; the current total is
    # attained_service + request.num_slots * (now - started_at)
    attained_service: float = 0.0
    # expected run time of this attempt counted from started_at, when known
    expected_duration_s: float | None = None
    submitted_at: float = 0.0
    # asked to checkpoint and exit (PREEMPTING): its capacity frees soon; never preempt it again
    preempting: bool = False
    # attempts of this trial that ended in a preemption (cool-down against ping-pong)
    num_preemptions: int = 0
    # the latest checkpoint of this attempt (or when its progress started counting), and the
    # usual time between its checkpoints, when known: how much work a preemption would lose
    last_checkpoint_at: float | None = None
    checkpoint_every_s: float | None = None

    def attained_at(self, now: float) -> float:
        return self.attained_service + self.request.num_slots * max(0.0, now - self.started_at)

    def work_at_risk_s(self, now: float) -> float:
        """Run time since the last checkpoint (known or expected): what preemption would lose."""
        base = self.started_at if self.last_checkpoint_at is None else self.last_checkpoint_at
        elapsed = max(0.0, now - base)
        if self.checkpoint_every_s:
            elapsed %= self.checkpoint_every_s
        return elapsed


@dataclass(frozen=True)
class TenantShare:
    """A tenant's guarantee, limit and weight, in slots.

    ``guaranteed_slots`` is what the tenant gets back by preemption when it wants it;
    ``limit_slots`` caps what it may hold at all (None: the whole cluster); ``weight`` divides the
    idle capacity between tenants that want more than their guarantee.
    """

    guaranteed_slots: int = 0
    limit_slots: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.guaranteed_slots < 0:
            raise ValueError(f"guaranteed_slots must be >= 0, got {self.guaranteed_slots}")
        if self.limit_slots is not None and self.limit_slots < self.guaranteed_slots:
            raise ValueError(
                f"limit_slots ({self.limit_slots}) must be >= guaranteed_slots "
                f"({self.guaranteed_slots})"
            )
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


@dataclass(frozen=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    # a tuple, or a TrialQueue (an indexed, immutable sequence) that spares the policy the indexing
    queue: Sequence[QueuedTrial]
    running: tuple[RunningTrial, ...] = ()
    tenants: Mapping[str, TenantShare] = field(default_factory=dict)
    # decayed slot-seconds each tenant used recently (trainhub.core.fairshare)
    tenant_usage: Mapping[str, float] = field(default_factory=dict)
    # each tenant's decayed received and entitled slot-seconds (trainhub.core.entitlement),
    # when the policy reads them (``BasePolicy.standing_half_life_s``)
    tenant_standing: Mapping[str, Standing] = field(default_factory=dict)
