"""Configuration of the fair-share policy: one frozen dataclass, validated on creation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C


@dataclass(frozen=True)
class FairShareConfig:
    """Knobs of :class:`~trainhub.core.scheduling.fair.FairSharePolicy` (units in the names).

    The defaults of ``min_run_time_s``, ``reclaim_rate_share_per_h``, ``borrow_by_service``
    and ``displace_by_service`` are the candidate the benchmark's tuning split chose on
    2026-11-27 (``benchmarks/scheduler.py --tune``, ADR 0036), with one reclaim budget for the
    cluster. The split run again on 2026-12-07 with the per-tenant budget and its floor chose
    displacement by service and a per-tenant budget; that candidate doubled the targets missed
    on the test split (10 -> 20 over its 18 windowed cells), so it was not shipped (ADR 0036,
    fourth amendment); with windows on 16 nodes added to the split it chose them again, with
    the same result on the test split (fifth amendment). The others predate it.

    Attributes:
        half_life_s: half-life of the decayed usage that orders tenants for idle capacity
            (Slurm's PriorityDecayHalfLife). Shorter forgets faster.
        aging_interval_s: waiting this long raises a trial by one priority level inside its
            tenant (low -> normal -> high), so a low-priority trial is never starved by a stream
            of higher-priority ones. 0 turns aging off.
        backfill: start trials behind a blocked head when they cannot delay its reservation.
        preemption: preempt borrowed capacity so a tenant below its guarantee gets it back.
        min_run_time_s: a trial is never preempted before it ran this long in its attempt.
        preemption_cooldown_s: a trial that was preempted before is protected this long after
            each restart (on top of min_run_time_s): no trial is bounced in and out.
        max_preemptions_per_pass: at most this many victims per decision.
        max_failed_claims_per_pass: after this many trials of a decision could not preempt
            anything, the others do not try until the next decision (bounds the work of one
            decision on a large cluster, like Slurm's limits on trials tested per cycle).
        service_thresholds_slot_s: attained service (GPU-seconds) that ends each band inside a
            tenant. Among trials of one tenant and priority the lower band goes first, and with
            ``preemption`` a waiting trial displaces a running one of its tenant in a higher
            band (Tiresias' discretised least-attained-service, within each tenant's share).
            Empty: submission order only, no displacement.
        hot_gpu_temperature_c: nodes this hot are used only when no cooler node fits; None
            turns the threshold off (cooler still wins ties).
        displace_by_service: with ``preemption``, a waiting trial also displaces a running
            trial of its tenant in a higher service band (priority displacement is always on).
            Off by default: the bands still order the queue, but displacing long runs cost
            more work (lost since the last checkpoint) than it saved in completion time on
            the windows measured (ADR 0005); the tuning split of 2026-12-07 chose it, and on
            the test split it cost 0.49-0.62 preemptions per job on Philly's 16-node cells
            (ADR 0036, fourth amendment: not shipped).
        gang_overshoot: a trial of a tenant below its guarantee whose gang goes past it by
            ``used + size - guarantee`` GPUs, no more than the tenant is still owed (at least
            half the gang within the guarantee), may, when borrowed
            capacity alone cannot make room, take lenders below their own guarantees by that
            much in all (a gang cannot be split; without this a gang larger than what its
            tenant is still owed waits for lenders to shrink on their own). The lenders are
            then below their guarantees and get the next free capacity first.
        cooldown_growth: the cool-down after a trial's n-th preemption is
            ``preemption_cooldown_s * cooldown_growth ** (n - 1)``: a trial preempted again
            and again is protected longer each time (hysteresis against the same trial
            bouncing). 1 keeps one cool-down.
        victim_fewest_preemptions: among a lender's trials that may be preempted, those
            preempted fewest times go first (then the least work since the last checkpoint),
            so preemptions spread over trials instead of hitting the same ones.
        estimates_for_backfill: expected durations set when the head's reservation starts
            and let a trial that ends before then start on capacity the head will need (EASY
            backfill on durations). Off by default: the server's expected durations are
            estimates (the median run time of finished trials of the same user and project),
            not limits the runtime enforces, so half the trials run past them, delay the head
            and cost its tenant its guarantee (ADR 0020). With it off, backfill uses only
            capacity the head will not need (the reservation's caps) and the reservation
            waits for releases of unknown time, as without any durations.
        patience_share: reclaim patience. A tenant below its guarantee preempts borrowers
            only when it is owed: when what it received (decayed, see
            ``standing_half_life_s``) would fall below this share of what it was entitled to
            within ``patience_horizon_s`` of its present shortfall. A tenant standing above
            that waits for capacity that frees on its own, still ahead of every borrower.
            The issue's measure is this ratio (>= 0.95), so the guarantee is kept as a
            time-averaged share, not at every instant, and lenders' trials are preempted
            less (ADR 0022). None: reclaim whenever below the guarantee.
        patience_horizon_s: see ``patience_share``: a tenant waits only while its surplus
            over that share covers this many seconds of its present shortfall, so a tenant
            with little history (small entitled totals) reclaims at once.
        standing_half_life_s: half-life of the received and entitled slot-seconds the
            patience reads (``core.entitlement``): how far back a tenant's standing counts.
        borrow_by_service: borrowed capacity goes to the borrowing tenant whose next trial
            has the least attained service (its service band, as inside a tenant), then to
            the lowest fair-share score: the trials likelier to finish first, without
            durations (Tiresias' least attained service across borrowers; ADR 0036). Off:
            the fair-share score alone orders borrowers.
        reclaim_rate_share_per_h: reclaims (preemptions that give a tenant back its
            guarantee) take at most this share of the tenant's guarantee per hour, from a
            budget of the tenant's own that refills at that rate up to
            ``reclaim_burst_share`` of its guarantee (at least one slot); a full budget lets
            one claim through whatever its size. Where the guarantees add up to the cluster
            (as they are scaled to when they exceed it), the tenants' rates add up to this
            share of the cluster's slots per hour. The policy keeps the budgets between
            decisions (a restart refills them). None: no bound (ADR 0036).
        reclaim_burst_share: a budget's ceiling, a share of the tenant's guarantee (of the
            cluster's slots with ``reclaim_budget_per_tenant`` off).
        reclaim_budget_per_tenant: every tenant reclaims from a budget of its own, sized by
            its guarantee, so one tenant's return does not spend the budget another owed
            tenant needs (ADR 0036, amendment). Off: one budget for all reclaims, refilling
            at ``reclaim_rate_share_per_h`` of the cluster's slots per hour up to
            ``reclaim_burst_share`` of them (the budget as first shipped).
        reclaim_floor_slots_per_h: with ``reclaim_budget_per_tenant``, a tenant's budget
            refills at ``max(reclaim_rate_share_per_h x its guarantee, this)`` slots per
            hour: a floor independent of the tenant's size, so a tenant guaranteed a slot or
            two still gets a small claim back within ``1 / this`` hours rather than hours per
            slot (ADR 0036, third amendment). It adds at most this many slots per hour per
            tenant to the cluster's total reclaim rate. 0: no floor. Unused with one budget.
        victim_time_left_s: a lender's trial expected to end within this many seconds
            (its expected duration, the server's estimate, less its run in this attempt) is
            taken after every other of the same priority and preemption count: preempting it
            saves the claimant little and costs its tenant the run. 0 turns it off.
        reserve_every_owed: every tenant below its guarantee gets a reservation for its
            first trial that does not fit, not only the first blocked trial of the pass, so
            backfill cannot starve a multi-GPU gang of an owed tenant with trials that take
            each GPU as it frees (ADR 0036).
    """

    half_life_s: float = 24 * 3600.0
    aging_interval_s: float = 3600.0
    backfill: bool = True
    preemption: bool = True
    min_run_time_s: float = 600.0
    preemption_cooldown_s: float = 1800.0
    max_preemptions_per_pass: int = 16
    max_failed_claims_per_pass: int = 4
    service_thresholds_slot_s: tuple[float, ...] = (3600.0, 36000.0)
    hot_gpu_temperature_c: float | None = HOT_GPU_TEMPERATURE_C
    displace_by_service: bool = False
    gang_overshoot: bool = True
    cooldown_growth: float = 4.0
    victim_fewest_preemptions: bool = True
    estimates_for_backfill: bool = False
    patience_share: float | None = 0.97
    patience_horizon_s: float = 1800.0
    standing_half_life_s: float = 7 * 24 * 3600.0
    borrow_by_service: bool = False
    reclaim_rate_share_per_h: float | None = 1.0
    reclaim_burst_share: float = 0.05
    reclaim_budget_per_tenant: bool = False
    reclaim_floor_slots_per_h: float = 0.0
    victim_time_left_s: float = 1800.0
    reserve_every_owed: bool = True

    def __post_init__(self) -> None:
        if self.patience_share is not None and not 0 < self.patience_share <= 1:
            raise ValueError(f"patience_share must be in (0, 1] or None, got {self.patience_share}")
        rate = self.reclaim_rate_share_per_h
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"reclaim_rate_share_per_h must be > 0 or None, got {rate}")
        if not 0 < self.reclaim_burst_share <= 1:
            raise ValueError(
                f"reclaim_burst_share must be in (0, 1], got {self.reclaim_burst_share}"
            )
        floor = self.reclaim_floor_slots_per_h
        if not (floor >= 0 and math.isfinite(floor)):
            raise ValueError(f"reclaim_floor_slots_per_h must be >= 0, got {floor}")
        for name in ("half_life_s", "standing_half_life_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for name in (
            "aging_interval_s",
            "min_run_time_s",
            "preemption_cooldown_s",
            "patience_horizon_s",
            "victim_time_left_s",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be >= 0 seconds, got {value}")
        if not (self.cooldown_growth >= 1 and math.isfinite(self.cooldown_growth)):
            raise ValueError(f"cooldown_growth must be >= 1, got {self.cooldown_growth}")
        for name in ("max_preemptions_per_pass", "max_failed_claims_per_pass"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        thresholds = self.service_thresholds_slot_s
        if any(not (t > 0 and math.isfinite(t)) for t in thresholds) or list(thresholds) != sorted(
            set(thresholds)
        ):
            raise ValueError(
                f"service_thresholds_slot_s must be positive and increasing, got {thresholds}"
            )
        if self.hot_gpu_temperature_c is not None and not math.isfinite(self.hot_gpu_temperature_c):
            raise ValueError("hot_gpu_temperature_c must be a finite temperature or None")
