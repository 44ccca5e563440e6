"""What each tenant was owed and what it got: the ledger behind reclaim patience.

At each instant a tenant is *entitled* to ``min(guarantee, demand)`` slots (demand: the slots
of its queued and running trials) and *receives* ``min(held, entitled)``. The issue's fairness
measure is received over entitled slot-time; this ledger keeps both, decayed with a half-life
(as :class:`~trainhub.core.fairshare.DecayedUsage` decays usage), so that the fair policy can
see how far above that measure a tenant stands and let it wait for capacity that frees on its
own instead of preempting (``FairShareConfig.patience_share``).

One class for the simulator and the server, as for decayed usage:

- the simulator calls :meth:`EntitlementLedger.change` at each arrival, start, end and
  preemption (a tenant is settled only when it changes or is read);
- the control loop calls :meth:`EntitlementLedger.observe` once a tick with what every tenant
  holds and demands; the values hold from that tick to the next. At start-up it rebuilds the
  ledger from the database's history (:meth:`EntitlementLedger.rebuild`), so a restart of the
  server does not forget who was served well.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainhub.core.fairshare import mean_life_s


@dataclass(frozen=True)
class Standing:
    """A tenant's decayed received and entitled slot-seconds."""

    received_slot_s: float
    entitled_slot_s: float

    def surplus_slot_s(self, share: float) -> float:
        """Slot-seconds received beyond ``share`` of what it was entitled to (< 0: short)."""
        return self.received_slot_s - share * self.entitled_slot_s


@dataclass(frozen=True)
class Interval:
    """``slots`` held or demanded by ``tenant`` from ``start`` to ``end`` (None: still)."""

    tenant: str
    slots: float
    start: float
    end: float | None


class _Account:
    __slots__ = ("demand", "entitled", "guarantee", "held", "received", "since")

    def __init__(self, since: float, guarantee: float) -> None:
        self.held = 0.0
        self.demand = 0.0
        self.guarantee = guarantee
        self.received = 0.0
        self.entitled = 0.0
        self.since = since


class EntitlementLedger:
    """Per tenant: decayed entitled and received slot-seconds (exact for values constant
    between changes, so the result does not depend on how often it is read)."""

    def __init__(self, half_life_s: float) -> None:
        """``half_life_s`` may be ``math.inf``: nothing decays (totals over a period)."""
        self.half_life_s = half_life_s
        self._tau = mean_life_s(half_life_s)
        self._accounts: dict[str, _Account] = {}
        self._guarantees: Mapping[str, float] = {}

    def _account(self, tenant: str, now: float) -> _Account:
        account = self._accounts.get(tenant)
        if account is None:
            account = _Account(now, self._guarantees.get(tenant, 0.0))
            self._accounts[tenant] = account
        return account

    def _settle(self, account: _Account, now: float) -> None:
        span = now - account.since
        if span <= 0:
            return
        account.since = now
        if math.isinf(self._tau):
            weight, factor = span, 1.0
        else:
            weight = self._tau * -math.expm1(-span / self._tau)
            factor = math.exp(-span / self._tau)
        entitled = min(account.guarantee, account.demand)
        received = min(account.held, entitled)
        account.entitled = account.entitled * factor + entitled * weight
        account.received = account.received * factor + received * weight

    def set_guarantees(self, guarantees: Mapping[str, float], now: float) -> None:
        """The guarantees from ``now`` on (scaled to the cluster as the policy scales them)."""
        if guarantees == self._guarantees:
            return
        self._guarantees = dict(guarantees)
        for tenant, account in self._accounts.items():
            self._settle(account, now)
            account.guarantee = self._guarantees.get(tenant, 0.0)

    def change(self, tenant: str, now: float, held: float = 0.0, demand: float = 0.0) -> None:
        """``tenant`` holds ``held`` and demands ``demand`` slots more from ``now`` on."""
        account = self._account(tenant, now)
        self._settle(account, now)
        account.held += held
        account.demand += demand

    def observe(self, held: Mapping[str, float], demand: Mapping[str, float], now: float) -> None:
        """What every tenant holds and demands from ``now`` on (the control loop, each tick)."""
        for tenant in set(self._accounts) | set(held) | set(demand):
            account = self._account(tenant, now)
            self._settle(account, now)
            account.held = held.get(tenant, 0.0)
            account.demand = max(demand.get(tenant, 0.0), account.held)

    def standing(self, now: float) -> dict[str, Standing]:
        """Every tenant's standing at ``now``."""
        out = {}
        for tenant, account in self._accounts.items():
            self._settle(account, now)
            out[tenant] = Standing(account.received, account.entitled)
        return out

    def rebuild(
        self,
        held: Iterable[Interval],
        demanded: Iterable[Interval],
        guarantees: Mapping[str, float],
        now: float,
    ) -> None:
        """The standings at ``now`` of this history (attempts held, trials demanded), replayed
        change by change against today's guarantees; then observed values take over."""
        changes: list[tuple[float, str, float, float]] = []
        for interval, kind in [(i, 0) for i in held] + [(i, 1) for i in demanded]:
            end = now if interval.end is None else min(interval.end, now)
            if end <= interval.start or interval.slots <= 0:
                continue
            held_d, demand_d = (interval.slots, 0.0) if kind == 0 else (0.0, interval.slots)
            changes.append((interval.start, interval.tenant, held_d, demand_d))
            if interval.end is not None and interval.end < now:
                changes.append((interval.end, interval.tenant, -held_d, -demand_d))
        changes.sort(key=lambda c: c[0])
        self._accounts = {}
        self._guarantees = dict(guarantees)
        for at, tenant, held_d, demand_d in changes:
            self.change(tenant, at, held=held_d, demand=demand_d)
        for account in self._accounts.values():
            self._settle(account, now)
