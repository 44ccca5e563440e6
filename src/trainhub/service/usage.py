"""Usage accounting: allocated slot-hours per tenant, user and project per day, and the share
each tenant received against its guarantee; and the decayed usage that fair share orders by.

An attempt holds its trial's slots from the moment it is scheduled until it ends: that is what
the tenant kept from others, whether or not its processes used them well.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainhub.core.entitlement import EntitlementLedger, Interval
from trainhub.core.errors import InvalidRequest
from trainhub.core.fairshare import DecayedUsage
from trainhub.service.auth import require_user, visible_tenants
from trainhub.service.clock import Clock
from trainhub.service.ports import Principal
from trainhub.service.records import AttemptUsage
from trainhub.service.repository import UnitOfWork
from trainhub.service.tracking import StorageQuota

DAY_S = 86_400.0

# the decayed usage that fair share orders by: one ledger for the server and the simulator
__all__ = ["DAY_S", "DecayedUsage", "UsageReport", "UsageRow", "UsageService", "account"]


@dataclass(frozen=True)
class UsageRow:
    day: str  # UTC date, YYYY-MM-DD
    tenant: str
    user: str
    project: str
    slot_hours: float
    # network bytes of the day's attempts (issue 30, docs/adr/0045): sent to and received from
    # the trial's other nodes, and exchanged between its ranks on one node
    inter_node_sent_bytes: int = 0
    inter_node_received_bytes: int = 0
    intra_node_bytes: int = 0


@dataclass(frozen=True)
class TenantShareRow:
    tenant: str
    guaranteed_slots: int
    slot_hours: float
    average_slots: float  # slot_hours / hours of the period
    # average_slots / guaranteed_slots; None when the tenant has no guarantee
    share_of_guarantee: float | None
    # the fairness measure: GPU-time received over GPU-time entitled to, being entitled
    # to min(guarantee, demand) at each instant; None when it was entitled to nothing
    guarantee_kept: float | None = None


@dataclass(frozen=True)
class TenantStorageRow:
    tenant: str
    checkpoint_bytes: int  # kept checkpoints now
    max_storage_bytes: int
    max_trial_storage_bytes: int
    max_checkpoint_bytes: int


@dataclass(frozen=True)
class UsageReport:
    since: float
    until: float
    rows: list[UsageRow]
    tenants: list[TenantShareRow]
    storage: list[TenantStorageRow] = field(default_factory=list)


def _day(timestamp: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(timestamp, _dt.UTC).strftime("%Y-%m-%d")


def split_by_day(start: float, end: float) -> Iterable[tuple[str, float]]:
    """(UTC day, seconds) pieces of the interval [start, end)."""
    cursor = start
    while cursor < end:
        next_midnight = (math.floor(cursor / DAY_S) + 1) * DAY_S
        piece_end = min(end, next_midnight)
        yield _day(cursor), piece_end - cursor
        cursor = piece_end


def account(
    attempts: Iterable[AttemptUsage], since: float, until: float
) -> dict[tuple[str, str, str, str], float]:
    """Slot-seconds per (day, tenant, user, project) inside [since, until)."""
    totals: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for a in attempts:
        start = max(a.start, since)
        end = min(a.end if a.end is not None else until, until)
        if end <= start or a.num_slots <= 0:
            continue
        for day, seconds in split_by_day(start, end):
            totals[(day, a.tenant, a.user, a.project)] += seconds * a.num_slots
    return totals


def guarantees_kept(
    attempts: Iterable[AttemptUsage],
    demand: Iterable[Interval],
    guarantees: Mapping[str, int],
    since: float,
    until: float,
) -> dict[str, float]:
    """Per tenant entitled to anything in [since, until): received over entitled slot-time
    (the measure the scheduler benchmark reports and reclaim patience reads, undecayed)."""
    if until <= since:
        return {}
    ledger = EntitlementLedger(math.inf)
    held = [Interval(a.tenant, a.num_slots, max(a.start, since), a.end) for a in attempts]
    wanted = [Interval(d.tenant, d.slots, max(d.start, since), d.end) for d in demand]
    ledger.rebuild(held, wanted, guarantees, until)
    return {
        tenant: s.received_slot_s / s.entitled_slot_s
        for tenant, s in ledger.standing(until).items()
        if s.entitled_slot_s > 0
    }


class UsageService:
    def __init__(self, uow: UnitOfWork, clock: Clock) -> None:
        self.uow = uow
        self.clock = clock

    def report(
        self, principal: Principal, since: float | None = None, until: float | None = None
    ) -> UsageReport:
        """Usage in [since, until) (default: the last 7 days), for the tenants one may see."""
        require_user(principal)
        now = self.clock()
        until = now if until is None else until
        since = until - 7 * DAY_S if since is None else since
        if since >= until:
            raise InvalidRequest("'since' must be before 'until'")
        allowed = visible_tenants(principal)
        with self.uow() as repo:
            attempts = [
                a for a in repo.attempt_usage(since) if allowed is None or a.tenant in allowed
            ]
            demand = [d for d in repo.trial_demand(since) if allowed is None or d.tenant in allowed]
            tenants = [t for t in repo.list_tenants() if allowed is None or t.name in allowed]
            stored = repo.checkpoint_bytes_by_tenant()
            traffic = [
                t
                for t in repo.traffic_usage(_day(since), _day(min(until, now)))
                if allowed is None or t.tenant in allowed
            ]
        storage = []
        for tenant in tenants:
            quota = StorageQuota.of(tenant)
            storage.append(
                TenantStorageRow(
                    tenant.name,
                    stored.get(tenant.name, 0),
                    quota.max_storage_bytes,
                    quota.max_trial_storage_bytes,
                    quota.max_checkpoint_bytes,
                )
            )
        totals = account(attempts, since, min(until, now))
        network: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for t in traffic:
            figures = network[(t.day, t.tenant, t.user, t.project)]
            if t.scope == "intra-node":
                figures[2] += t.sent_bytes
            else:
                figures[0] += t.sent_bytes
                figures[1] += t.received_bytes
        rows = [
            UsageRow(day, tenant, user, project, totals.get(key, 0.0) / 3600.0, *network[key])
            for key in sorted({*totals, *network})
            for (day, tenant, user, project) in [key]
        ]
        hours = (until - since) / 3600.0
        by_tenant: dict[str, float] = defaultdict(float)
        for row in rows:
            by_tenant[row.tenant] += row.slot_hours
        kept = guarantees_kept(
            attempts, demand, {t.name: t.guaranteed_slots for t in tenants}, since, min(until, now)
        )
        shares = []
        for tenant in tenants:
            slot_hours = by_tenant.get(tenant.name, 0.0)
            average = slot_hours / hours
            ratio = average / tenant.guaranteed_slots if tenant.guaranteed_slots else None
            shares.append(
                TenantShareRow(
                    tenant.name,
                    tenant.guaranteed_slots,
                    slot_hours,
                    average,
                    ratio,
                    kept.get(tenant.name),
                )
            )
        return UsageReport(since, until, rows, shares, storage)


CSV_HEADER = (
    "day",
    "tenant",
    "user",
    "project",
    "slot_hours",
    "inter_node_sent_bytes",
    "inter_node_received_bytes",
    "intra_node_bytes",
)


def usage_csv(rows: Iterable[UsageRow]) -> str:
    """The rows as CSV (the API's ``format=csv`` and the dashboard's download)."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_HEADER)
    for r in rows:
        writer.writerow(
            [r.day, r.tenant, r.user, r.project, f"{r.slot_hours:.4f}", r.inter_node_sent_bytes,
             r.inter_node_received_bytes, r.intra_node_bytes]
        )  # fmt: skip
    return buffer.getvalue()
