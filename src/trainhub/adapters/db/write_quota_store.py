"""SQLAlchemy implementation of :class:`~trainhub.service.repository.WriteQuotaStore`, mixed
into the main repository: what a trial wrote beyond the API's checkpoints (metric points
stored and dropped; bytes its nodes measured in its folders), counted in the transaction of
the write it belongs to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from trainhub.adapters.db.models import CheckpointRow, TenantRow, TrialRow


class SqlWriteQuotaStore:
    s: Session

    def add_metric_counts(self, trial_id: int, stored: int, dropped: int) -> None:
        if not stored and not dropped:
            return
        self.s.execute(
            update(TrialRow)
            .where(TrialRow.id == trial_id)
            .values(
                metric_points=TrialRow.metric_points + stored,
                metric_points_dropped=TrialRow.metric_points_dropped + dropped,
            )
        )

    def record_disk_bytes(self, sizes: Mapping[int, int]) -> None:
        if not sizes:
            return
        self.s.execute(
            update(TrialRow),
            [{"id": trial_id, "disk_bytes": size} for trial_id, size in sizes.items()],
        )

    def disk_bytes_by_tenant(self) -> dict[str, int]:
        rows = self.s.execute(
            select(TenantRow.name, func.coalesce(func.sum(TrialRow.disk_bytes), 0))
            .join(TrialRow, TrialRow.tenant_id == TenantRow.id)
            .where(TrialRow.disk_bytes > 0)
            .group_by(TenantRow.name)
        ).all()
        return {str(name): int(total) for name, total in rows}

    def checkpoint_bytes_of(self, trial_ids: Sequence[int]) -> dict[int, int]:
        if not trial_ids:
            return {}
        rows = self.s.execute(
            select(CheckpointRow.trial_id, func.coalesce(func.sum(CheckpointRow.size_bytes), 0))
            .where(CheckpointRow.trial_id.in_(trial_ids), CheckpointRow.deleted.is_(False))
            .group_by(CheckpointRow.trial_id)
        ).all()
        return {int(trial_id): int(total) for trial_id, total in rows}
