"""Choosing which running trials to preempt, and when that is allowed.

Two kinds of preemption, both ending in a checkpoint and a return to the queue:

*Reclaim* gives a tenant back its guaranteed share. Only a trial of a tenant below its
guarantee may reclaim (``fair.entitled``; its trial may take it past the guarantee, once: a gang
cannot be split), and only from tenants that stay at or above their own guarantee without the
victim: whoever is preempted was borrowing and cannot claim the capacity back, and a tenant that
went past its guarantee with its last gang cannot lose that gang to a claim, so tenants cannot
ping-pong. The one exception (ADR 0018): a gang that goes past its tenant's guarantee by no
more than the tenant is still owed may take lenders, then tenants exactly at their guarantee,
below their guarantees by that overshoot in all.

*Displace* works inside one tenant: a waiting trial may preempt a running trial of its own
tenant with a lower priority, or with the same priority and a higher attained-service band
(least attained service first, as Tiresias does between jobs): long runs yield to new short
ones, and the tenant's share is unchanged. A band only grows while a trial runs, so the
displaced trial cannot displace its displacer back.

For both: a victim must have run ``min_run_time_s`` in its current attempt (and
``cooldown_s`` if its trial was preempted before); a trial already being preempted is never
asked again, and the capacity it is about to free serves the next claim before any new victim
is chosen. Victims are the trials the rules prefer (most borrowed tenant, lowest priority,
highest band, most recently started), as few GPUs as possible: a gang that fits on one node is
claimed on the one node that needs the fewest preempted GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import QueuedTrial, RunningTrial, TenantShare
from trainhub.core.scheduling.victims import (
    Candidates,
    ClaimMemo,
    PreemptionRules,
    Risk,
    TenantVictims,
    VictimFacts,
)

_DEFAULT_SHARE = TenantShare()


class Preemptor:
    """Victims for the claims of one pass (built on the first claim, used by the next ones)."""

    def __init__(
        self,
        *,
        running: RunningTable,
        shares: Mapping[str, TenantShare],
        used: Mapping[str, int],
        now: float,
        rules: PreemptionRules,
        facts: VictimFacts,
        memo: ClaimMemo | None = None,
    ) -> None:
        self._running = running
        self._facts = facts
        self._memo = memo or ClaimMemo()
        self._shares = shares
        self._used = used
        self._now = now
        self._rules = rules
        self._left = rules.max_victims
        self._incoming: dict[str, int] = {}
        self._taken: dict[str, int] = {}
        self._chosen: set[int] = set()
        # per tenant, computed on first use: trials that may be preempted now, and
        # (eligible_at, trial) of those still protected by min run time or cool-down
        self._ready: dict[str, list[RunningTrial]] = {}
        self._young: dict[str, list[tuple[float, RunningTrial]]] = {}
        self._band: dict[int, int] = {}
        self._risk_params: dict[int, Risk] = {}
        self._until: dict[str, float] = {}
        self._states: dict[str, TenantVictims] = {}
        # per tenant: (lowest priority rank, highest band) among the trials ready to preempt
        self._weakest: dict[str, tuple[int, int]] = {}
        # (size, overshoot) of the smallest claim that already failed this pass: a larger
        # one with no more overshoot fails too
        self._failed_reclaim: tuple[int, int] | None = None
        # tenants above their guarantee, and their preemptible trials in victim order
        self._lenders: list[str] | None = None
        self._lent: Candidates | None = None
        self._over: set[str] = set()
        # lenders' and near tenants' trials for gangs with an overshoot, by the near tenants
        self._near_lent: dict[tuple[str, ...], Candidates] = {}
        self._failed_incoming: int | None = None
        # tenants whose best waiting trial could not displace anything: the others cannot either
        self._failed_displace: set[str] = set()
        for trial in running.preempting:
            g = trial.request.gpus_per_worker
            for node in trial.placement:
                self._incoming[node] = self._incoming.get(node, 0) + g
        self._incoming_total = sum(self._incoming.values())
        # earliest time a claim that failed this pass could succeed thanks to a trial aging in
        self.wake_at: float | None = None
        # the last reclaim found victims but not within the reclaim budget
        self.over_budget = False
        # the free GPUs per node the last claim's placement counts on besides the capacity
        # being freed: the caller sets them aside for the claimant (ADR 0042)
        self.free_part: dict[str, int] = {}

    def _tenant(self, tenant: str) -> list[RunningTrial]:
        ready = self._ready.get(tenant)
        if ready is not None:
            return ready
        state = self._facts.victims(tenant, self._running.by_tenant.get(tenant, ()), self._now)
        self._states[tenant] = state
        self._band.update(state.band)
        self._risk_params.update(state.risk)
        self._ready[tenant] = state.ready
        self._young[tenant] = state.young
        self._until[tenant] = state.until
        if state.weakest is not None:
            self._weakest[tenant] = state.weakest
        return state.ready

    def _risk(self, trial_id: int) -> float:
        """Slot-seconds a preemption of the trial would lose now."""
        slots, base, period, _, _ = self._risk_params[trial_id]
        at_risk = max(0.0, self._now - base)
        if period:
            at_risk %= period
        return at_risk * slots

    @property
    def spent(self) -> bool:
        """No victim may be chosen any more in this decision."""
        return self._left <= 0

    # -- rules -------------------------------------------------------------------------------

    def _share(self, tenant: str) -> TenantShare:
        return self._shares.get(tenant, _DEFAULT_SHARE)

    def _spare(self, tenant: str) -> int:
        """Slots the tenant holds above its guarantee, less those already claimed."""
        return (
            self._used.get(tenant, 0)
            - self._taken.get(tenant, 0)
            - self._share(tenant).guaranteed_slots
        )

    def _deficit_caused(self, victims: Sequence[RunningTrial]) -> int:
        """Slots by which preempting ``victims`` takes their tenants below their guarantees."""
        lost: dict[str, int] = {}
        for victim in victims:
            lost[victim.tenant] = lost.get(victim.tenant, 0) + victim.request.num_slots
        caused = 0
        for tenant, slots in lost.items():
            held = self._used.get(tenant, 0) - self._taken.get(tenant, 0)
            guarantee = self._share(tenant).guaranteed_slots
            caused += max(0, guarantee - (held - slots)) - max(0, guarantee - held)
        return caused

    def _lower(self, victim: RunningTrial, trial: QueuedTrial, band: int) -> bool:
        """Whether ``trial`` (in ``band``) outranks ``victim`` of its own tenant."""
        if victim.priority.rank != trial.priority.rank:
            return victim.priority.rank < trial.priority.rank
        victim_band = self._band.get(victim.trial_id)
        if victim_band is None:
            victim_band = self._rules.band(victim.attained_at(self._now))
        return victim_band > band

    # -- claims ------------------------------------------------------------------------------

    def incoming_suffices(self, trial: QueuedTrial, pool: NodePool) -> bool:
        """Whether capacity that preempted trials are about to free lets ``trial`` start; if so
        that capacity is set aside for it."""
        size = trial.request.num_slots
        gpu_bound = trial.request.gpus_per_worker > 0
        if gpu_bound and pool.total_free + self._incoming_total < size:
            return False
        if self._failed_incoming is not None and size >= self._failed_incoming:
            return False
        hypothetical = self._with_incoming(pool)
        ranks = hypothetical.place(trial.request)
        if ranks is None:
            if not trial.request.node_labels:
                self._failed_incoming = size
            return False
        # the trial did not fit ``pool`` alone, so part of it lands on capacity being freed:
        # set that part aside, or a whole queue would wait for the same few GPUs
        return self._consume(ranks, trial.request.gpus_per_worker, pool) > 0

    def reclaim(
        self, trial: QueuedTrial, pool: NodePool, overshoot: int = 0, budget: float = math.inf
    ) -> tuple[RunningTrial, ...] | None:
        """Victims borrowed from other tenants that make room for ``trial``, or None.

        The tenant furthest above its guarantee (per weight) is asked first, alone; only if
        its trials cannot make room are all lenders' trials considered together. A gang with
        an ``overshoot`` (FairShareConfig.gang_overshoot) may then take lenders, and tenants
        exactly at their guarantee, below their guarantees by that many slots in all.
        """
        size = trial.request.num_slots
        failed = self._failed_reclaim
        if self._left <= 0 or (failed is not None and size >= failed[0] and overshoot <= failed[1]):
            return None
        claimant = trial.tenant
        plain = not trial.request.node_labels
        if plain and self._memo.reclaim_fails(claimant, size, overshoot, self._now):
            return None
        if self._lenders is None:
            over = {
                tenant: (held - self._share(tenant).guaranteed_slots) / self._share(tenant).weight
                for tenant, held in self._used.items()
                if held > self._share(tenant).guaranteed_slots
            }
            self._lenders = sorted(over, key=lambda t: (-over[t], t))
            self._over = set(over)

        allowed = self._lenders_rule(claimant, 0)
        others = [t for t in self._lenders if t != claimant]
        victims = None
        self.over_budget = False
        affordable: Callable[[Sequence[RunningTrial]], bool] | None = None
        if budget != math.inf:

            def affordable(victims: Sequence[RunningTrial]) -> bool:
                if sum(v.request.num_slots for v in victims) <= budget:
                    return True
                self.over_budget = True
                return False

        if others and self._spare(others[0]) > 0:
            victims = self._choose(trial, pool, self._lender(others[0]), allowed, affordable)
        if victims is None and len(others) > 1:
            victims = self._choose(trial, pool, self._all_lent(), allowed, affordable)
        near: list[str] = []
        if victims is None and overshoot > 0:
            # a gang larger than what its tenant is still owed: other tenants may go below
            # their guarantee by at most what the gang goes past the claimant's, all together.
            # Lenders are asked first, then the tenants exactly at their guarantee (where
            # nobody borrows, a gang that needs a whole node would otherwise wait for one to
            # drain on its own); tenants already below their guarantee are never asked
            near = [
                tenant
                for tenant, held in self._used.items()
                if tenant != claimant
                and tenant not in self._over
                and held - self._taken.get(tenant, 0) >= self._share(tenant).guaranteed_slots
            ]
            if others or near:
                relaxed = self._lenders_rule(claimant, overshoot)

                def within(victims: Sequence[RunningTrial]) -> bool:
                    return self._deficit_caused(victims) <= overshoot and (
                        affordable is None or affordable(victims)
                    )

                victims = self._choose(trial, pool, self._relaxed(near), relaxed, within)
        if victims is None:
            young = [at for tenant in (*others, *near) for at, _ in self._young.get(tenant, ())]
            self._note_young(young)
            if plain and not self.over_budget:
                # a claim refused for the budget alone may pass once it refilled: not memoised
                self._failed_reclaim = (size, overshoot)
                self._memo.reclaim_failed(claimant, size, overshoot, min(young, default=math.inf))
        return victims

    def _relaxed(self, near: Sequence[str]) -> Candidates:
        """The lenders' trials (:meth:`_all_lent`), then those of the tenants ``near`` (at
        their guarantee), in lender order."""
        key = tuple(sorted(near))
        known = self._near_lent.get(key)
        if known is None:
            lent = self._all_lent() if self._lenders else Candidates([], self._facts)
            if not near:
                return lent
            extra = [v for tenant in key for v in self._tenant(tenant)]
            keys = self._lender_keys(extra)
            order = sorted(range(len(extra)), key=keys.__getitem__)
            known = Candidates(
                [trial for trial, _, _ in lent.items] + [extra[i] for i in order], self._facts
            )
            self._near_lent[key] = known
        return known

    def _lenders_rule(self, claimant: str, below: int) -> Callable[[RunningTrial, int], bool]:
        """Whether a victim may be taken for ``claimant``: another tenant's trial, not yet
        chosen, whose tenant
        stays at or above its guarantee (less ``below``) without it and ``taken`` more
        slots. Valid while no victim is committed: each claim makes its own."""
        slack: dict[str, int] = {}
        used, claimed, share, chosen = self._used, self._taken, self._share, self._chosen

        def allowed(victim: RunningTrial, taken: int) -> bool:
            tenant = victim.tenant
            if tenant == claimant or victim.trial_id in chosen:
                return False
            left = slack.get(tenant)
            if left is None:
                left = slack[tenant] = (
                    used.get(tenant, 0)
                    - claimed.get(tenant, 0)
                    - share(tenant).guaranteed_slots
                    + below
                )
            return left - taken - victim.request.num_slots >= 0

        return allowed

    def _all_lent(self) -> Candidates:
        """Every lender's preemptible trials together, in lender order (:meth:`_lender_keys`)."""
        if self._lent is None:
            assert self._lenders is not None
            lent = [v for tenant in self._lenders for v in self._tenant(tenant)]
            keys = self._lender_keys(lent)
            order = sorted(range(len(lent)), key=keys.__getitem__)
            self._lent = Candidates([lent[i] for i in order], self._facts)
        return self._lent

    def _lender_keys(
        self, trials: Sequence[RunningTrial]
    ) -> list[tuple[int, int, bool, float, int]]:
        """Lenders' victims go lowest priority first, then (optionally) preempted fewest
        times, then those not expected to end soon (``time_left_s``: the time they have
        left), then least work at risk (the work a preemption loses): each trial's sort key."""
        now = self._now
        params = self._risk_params
        fewest = self._rules.fewest_preemptions_first
        soon = self._rules.time_left_s
        keys = []
        for v in trials:
            slots, base, period, rank, preemptions = params[v.trial_id]
            at_risk = max(0.0, now - base)
            if period:
                at_risk %= period
            expected = v.expected_duration_s
            ending = bool(soon) and expected is not None and v.started_at + expected - now <= soon
            keys.append((rank, preemptions if fewest else 0, ending, at_risk * slots, v.trial_id))
        return keys

    def _lender(self, tenant: str) -> Candidates:
        """One lender's preemptible trials in lender order (:meth:`_lender_keys`)."""
        self._tenant(tenant)
        state = self._states[tenant]
        if state.as_lender is None:
            keys = self._lender_keys(state.ready)
            order = sorted(range(len(keys)), key=keys.__getitem__)
            state.as_lender = Candidates([state.ready[i] for i in order], self._facts)
        return state.as_lender

    def displace(
        self, trial: QueuedTrial, band: int, pool: NodePool
    ) -> tuple[RunningTrial, ...] | None:
        """Victims of ``trial``'s own tenant that it outranks, or None."""
        tenant = trial.tenant
        if self._left <= 0 or tenant in self._failed_displace:
            return None
        memo_key = (tenant, trial.priority.rank, band)
        plain = not trial.request.node_labels
        if plain and self._memo.displace_fails(memo_key, self._now):
            self._failed_displace.add(tenant)
            return None
        ready = self._tenant(tenant)
        weakest = self._weakest.get(tenant)
        rank = trial.priority.rank
        victims = None
        if weakest is not None and (
            weakest[0] < rank or (weakest[0] == rank and weakest[1] > band)
        ):
            state = self._states[tenant]
            if state.as_own is None:
                state.as_own = Candidates(
                    sorted(
                        ready,
                        key=lambda v: (
                            v.priority.rank,
                            -self._band[v.trial_id],
                            self._risk(v.trial_id),
                            v.trial_id,
                        ),
                    ),
                    self._facts,
                )
            own = state.as_own
            chosen = self._chosen
            victims = self._choose(
                trial,
                pool,
                own,
                lambda victim, taken: (
                    victim.trial_id not in chosen and self._lower(victim, trial, band)
                ),
            )
        if victims is None:
            self._failed_displace.add(tenant)
            young = [at for at, v in self._young.get(tenant, ()) if self._lower(v, trial, band)]
            self._note_young(young)
            if plain and not self.over_budget:
                # a claim refused for the budget alone may pass once it refilled: not memoised
                until = min(young, default=math.inf)
                until = min(until, self._until.get(tenant, math.inf))
                self._memo.displace_failed(memo_key, until)
        return victims

    def _note_young(self, times: Iterable[float]) -> None:
        earliest = min(times, default=None)
        if earliest is not None and (self.wake_at is None or earliest < self.wake_at):
            self.wake_at = earliest

    # -- victim search -----------------------------------------------------------------------

    def _choose(
        self,
        trial: QueuedTrial,
        pool: NodePool,
        candidates: Candidates,
        allowed: Callable[[RunningTrial, int], bool],
        check: Callable[[Sequence[RunningTrial]], bool] | None = None,
    ) -> tuple[RunningTrial, ...] | None:
        """Victims among ``candidates`` (in preference order) that ``allowed`` admits (and
        ``check`` accepts as a whole); ``allowed`` refuses the trials already chosen."""
        ok = allowed

        need = trial.request.num_slots
        have = pool.total_free + self._incoming_total
        if trial.request.gpus_per_worker and have < need:
            # cheap bound first: all the allowed victims together must free enough
            for victim, _, _ in candidates.items:
                if ok(victim, 0):
                    have += victim.request.num_slots
                    if have >= need:
                        break
            else:
                return None
        victims = self._one_victim(trial, pool, candidates, ok)
        if victims is None:
            victims = self._on_one_node(trial, pool, candidates, ok)
        if victims is None and not trial.request.single_node:
            victims = self._greedy(trial, pool, candidates, ok)
        if victims is None or len(victims) > self._left:
            return None
        if check is not None and not check(victims):
            return None
        for victim in victims:
            self._chosen.add(victim.trial_id)
            self._taken[victim.tenant] = (
                self._taken.get(victim.tenant, 0) + victim.request.num_slots
            )
            for node in victim.placement:
                self._incoming[node] = self._incoming.get(node, 0) + victim.request.gpus_per_worker
            self._incoming_total += victim.request.num_slots
        self._left -= len(victims)
        self._failed_incoming = None
        self.free_part = {}
        ranks = self._with_incoming(pool).place(trial.request)
        if ranks is not None:
            self._consume(ranks, trial.request.gpus_per_worker, pool)
        return tuple(victims)

    def _with_incoming(self, pool: NodePool) -> NodePool:
        hypothetical = pool.copy()
        for node, gpus in self._incoming.items():
            if gpus:
                hypothetical.adjust(node, gpus)
        return hypothetical

    def _consume(self, ranks: tuple[str, ...], gpus_per_rank: int, pool: NodePool) -> int:
        """Take from the incoming capacity what ``ranks`` need beyond the free GPUs of their
        nodes; how many GPUs that was."""
        need: dict[str, int] = {}
        for node in ranks:
            need[node] = need.get(node, 0) + gpus_per_rank
        taken = 0
        self.free_part = {}
        for node, gpus in need.items():
            within = min(gpus, pool.usable(node))
            if within > 0:
                self.free_part[node] = within
            beyond = gpus - within
            have = self._incoming.get(node, 0)
            used = min(have, beyond)
            if used:
                self._incoming[node] = have - used
                self._incoming_total -= used
                taken += used
        return taken

    def _room_with(self, pool: NodePool, node_id: str, extra: int, request: QueuedTrial) -> int:
        g = request.request.gpus_per_worker
        have = pool.usable(node_id) + self._incoming.get(node_id, 0) + extra
        return have // g if g else 10**9

    def _one_victim(
        self,
        trial: QueuedTrial,
        pool: NodePool,
        candidates: Candidates,
        allowed: Callable[[RunningTrial, int], bool],
    ) -> list[RunningTrial] | None:
        """The first victim (in preference order) that alone makes room for a gang that fits
        on one node, if it is no larger than the gang: the common, cheap case."""
        request = trial.request
        need = request.num_slots
        k = request.num_workers
        most = pool.largest_free() + max(self._incoming.values(), default=0) + candidates.most_gpus
        if request.gpus_per_worker and most < need:
            return None
        # a victim needs this many GPUs on one node to make room there (room_with below)
        least = need - (most - candidates.most_gpus) if request.gpus_per_worker else 0
        fits_whole: dict[str, bool] = {}
        for victim, per_node, here in candidates.items:
            if here < least or victim.request.num_slots > need or not allowed(victim, 0):
                continue
            for node_id, gpus in per_node:
                whole = fits_whole.get(node_id)
                if whole is None:
                    where = pool.nodes.get(node_id)
                    whole = where is not None and where.fits(request, free=False) >= k
                    fits_whole[node_id] = whole
                if whole and self._room_with(pool, node_id, gpus, trial) >= k:
                    return [victim]
        return None

    def _on_one_node(
        self,
        trial: QueuedTrial,
        pool: NodePool,
        candidates: Candidates,
        allowed: Callable[[RunningTrial, int], bool],
    ) -> list[RunningTrial] | None:
        """Victims in preference order, counted per node, until one node has room for the
        whole gang: that node's victims."""
        request = trial.request
        k = request.num_workers
        if not request.node_labels and pool.most_ranks_empty(request) < k:
            return None  # no node holds the whole gang even when empty
        freed: dict[str, int] = {}
        chosen: dict[str, list[RunningTrial]] = {}
        taken: dict[str, dict[str, int]] = {}
        fits_whole: dict[str, bool] = {}
        for victim, per_node, _ in candidates.items:
            for node_id, gpus in per_node:
                whole = fits_whole.get(node_id)
                if whole is None:
                    where = pool.nodes.get(node_id)
                    whole = where is not None and where.fits(request, free=False) >= k
                    fits_whole[node_id] = whole
                if not whole:
                    continue
                by_tenant = taken.setdefault(node_id, {})
                if not allowed(victim, by_tenant.get(victim.tenant, 0)):
                    continue
                by_tenant[victim.tenant] = (
                    by_tenant.get(victim.tenant, 0) + victim.request.num_slots
                )
                here = chosen.setdefault(node_id, [])
                here.append(victim)
                freed[node_id] = freed.get(node_id, 0) + gpus
                if len(here) > self._left:
                    continue
                if self._room_with(pool, node_id, freed[node_id], trial) >= k:
                    return here
        return None

    def _greedy(
        self,
        trial: QueuedTrial,
        pool: NodePool,
        candidates: Candidates,
        allowed: Callable[[RunningTrial, int], bool],
    ) -> list[RunningTrial] | None:
        """Victims in preference order until the gang fits across nodes, then the unneeded
        ones dropped again."""
        request = trial.request
        hypothetical = self._with_incoming(pool)
        chosen: list[RunningTrial] = []
        taken: dict[str, int] = {}
        for victim, _, _ in candidates.items:
            if len(chosen) >= self._left:
                return None
            if not allowed(victim, taken.get(victim.tenant, 0)):
                continue
            chosen.append(victim)
            taken[victim.tenant] = taken.get(victim.tenant, 0) + victim.request.num_slots
            _release(hypothetical, victim, +1)
            enough = not request.gpus_per_worker or hypothetical.total_free >= request.num_slots
            if enough and hypothetical.place(request):
                break
        else:
            return None
        for victim in reversed(chosen[:-1]):
            _release(hypothetical, victim, -1)
            if hypothetical.place(request) is None:
                _release(hypothetical, victim, +1)
            else:
                chosen.remove(victim)
        return chosen


def _release(pool: NodePool, victim: RunningTrial, sign: int) -> None:
    request = victim.request
    g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
    for node in victim.placement:
        pool.adjust(node, sign * g, sign * c, sign * m)
