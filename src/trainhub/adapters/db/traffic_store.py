"""SQLAlchemy implementation of :class:`~trainhub.service.repository.TrafficStore`, mixed into
the main repository: the network bytes each attempt's ranks sent and received, per scope and
UTC day (migration 0020). The control loop is the only writer (service/traffic.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import (
    AttemptRow,
    Base,
    ExperimentRow,
    TenantRow,
    TrialRow,
    UserRow,
)
from trainhub.core.traffic import Flow, TrafficDelta
from trainhub.service.records import TrafficRecord, TrafficUsage


class NetworkUsageRow(Base):
    __tablename__ = "network_usage"
    __table_args__ = (UniqueConstraint("attempt_id", "rank", "scope", "day"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(
        ForeignKey("attempts.id", ondelete="CASCADE"), index=True
    )
    trial_id: Mapped[int] = mapped_column(Integer, index=True)
    rank: Mapped[int] = mapped_column(Integer)
    scope: Mapped[str] = mapped_column(String(16))  # inter-node | intra-node
    day: Mapped[str] = mapped_column(String(10), index=True)  # UTC, YYYY-MM-DD
    sent_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    received_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    source: Mapped[str] = mapped_column(String(8))  # kernel | hooks (core/traffic.py)


class SqlTrafficStore:
    s: Session

    def add_traffic(
        self, day: str, trial_of: dict[int, int], deltas: Sequence[TrafficDelta]
    ) -> None:
        if not deltas:
            return
        attempts = sorted({d.attempt_id for d in deltas})
        existing = {
            (r.attempt_id, r.rank, r.scope): r
            for r in self.s.scalars(
                select(NetworkUsageRow).where(
                    NetworkUsageRow.day == day, NetworkUsageRow.attempt_id.in_(attempts)
                )
            )
        }
        for d in deltas:
            row = existing.get((d.attempt_id, d.rank, d.scope.value))
            if row is None:
                row = NetworkUsageRow(
                    attempt_id=d.attempt_id,
                    trial_id=trial_of[d.attempt_id],
                    rank=d.rank,
                    scope=d.scope.value,
                    day=day,
                    sent_bytes=0,
                    received_bytes=0,
                    source=d.source.value,
                )
                self.s.add(row)
                existing[(d.attempt_id, d.rank, d.scope.value)] = row
            row.sent_bytes += d.sent
            row.received_bytes += d.received
            row.source = d.source.value

    def traffic_totals(self, attempt_ids: Sequence[int]) -> dict[int, dict[tuple[int, str], Flow]]:
        if not attempt_ids:
            return {}
        rows = self.s.execute(
            select(
                NetworkUsageRow.attempt_id,
                NetworkUsageRow.rank,
                NetworkUsageRow.scope,
                func.sum(NetworkUsageRow.sent_bytes),
                func.sum(NetworkUsageRow.received_bytes),
            )
            .where(NetworkUsageRow.attempt_id.in_(attempt_ids))
            .group_by(NetworkUsageRow.attempt_id, NetworkUsageRow.rank, NetworkUsageRow.scope)
        ).all()
        out: dict[int, dict[tuple[int, str], Flow]] = {a: {} for a in attempt_ids}
        for attempt_id, rank, scope, sent, received in rows:
            out[int(attempt_id)][(int(rank), str(scope))] = Flow(int(sent), int(received))
        return out

    def traffic_usage(self, since_day: str, until_day: str) -> list[TrafficUsage]:
        rows = self.s.execute(
            select(
                NetworkUsageRow.day,
                TenantRow.name,
                UserRow.username,
                ExperimentRow.project,
                NetworkUsageRow.scope,
                func.sum(NetworkUsageRow.sent_bytes),
                func.sum(NetworkUsageRow.received_bytes),
            )
            .join(TrialRow, TrialRow.id == NetworkUsageRow.trial_id)
            .join(ExperimentRow, ExperimentRow.id == TrialRow.experiment_id)
            .join(TenantRow, TenantRow.id == ExperimentRow.tenant_id)
            .join(UserRow, UserRow.id == ExperimentRow.owner_id)
            .where(NetworkUsageRow.day >= since_day, NetworkUsageRow.day <= until_day)
            .group_by(
                NetworkUsageRow.day,
                TenantRow.name,
                UserRow.username,
                ExperimentRow.project,
                NetworkUsageRow.scope,
            )
            .order_by(NetworkUsageRow.day, TenantRow.name, UserRow.username)
        ).all()
        return [
            TrafficUsage(str(d), str(t), str(u), str(p), str(s), int(a), int(b))
            for d, t, u, p, s, a, b in rows
        ]

    def trial_traffic(self, trial_id: int) -> list[TrafficRecord]:
        rows = self.s.execute(
            select(
                AttemptRow.number,
                NetworkUsageRow.rank,
                NetworkUsageRow.scope,
                func.sum(NetworkUsageRow.sent_bytes),
                func.sum(NetworkUsageRow.received_bytes),
                func.max(NetworkUsageRow.source),
            )
            .join(AttemptRow, AttemptRow.id == NetworkUsageRow.attempt_id)
            .where(NetworkUsageRow.trial_id == trial_id)
            .group_by(AttemptRow.number, NetworkUsageRow.rank, NetworkUsageRow.scope)
            .order_by(AttemptRow.number, NetworkUsageRow.rank, NetworkUsageRow.scope)
        ).all()
        return [
            TrafficRecord(int(n), int(r), str(s), int(a), int(b), str(src))
            for n, r, s, a, b, src in rows
        ]

    def traffic_by_trial(self) -> list[tuple[str, int, str, int, int]]:
        """(tenant, trial id, scope, sent, received) over all time: /metrics' counters."""
        rows = self.s.execute(
            select(
                TenantRow.name,
                NetworkUsageRow.trial_id,
                NetworkUsageRow.scope,
                func.sum(NetworkUsageRow.sent_bytes),
                func.sum(NetworkUsageRow.received_bytes),
            )
            .join(TrialRow, TrialRow.id == NetworkUsageRow.trial_id)
            .join(TenantRow, TenantRow.id == TrialRow.tenant_id)
            .group_by(TenantRow.name, NetworkUsageRow.trial_id, NetworkUsageRow.scope)
            .order_by(NetworkUsageRow.trial_id, NetworkUsageRow.scope)
        ).all()
        return [(str(t), int(i), str(s), int(a), int(b)) for t, i, s, a, b in rows]
