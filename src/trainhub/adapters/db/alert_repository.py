"""SQLAlchemy implementation of :class:`~trainhub.service.repository.LayerAlertStore`, mixed
into the main repository so alerts are written in the transaction of their metrics."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainhub.adapters.db.alert_models import LayerAlertRow
from trainhub.core.layer_alerts import LayerAlert
from trainhub.service.records import LayerAlertRecord


class SqlLayerAlertStore:
    s: Session

    def record_layer_alerts(self, trial_id: int, alerts: Sequence[LayerAlert], now: float) -> None:
        # the earliest and latest occurrence of each (kind, layer) in this batch
        first: dict[tuple[str, str], LayerAlert] = {}
        last: dict[tuple[str, str], int] = {}
        for alert in alerts:
            key = (str(alert.kind), alert.layer)
            if key not in first or alert.step < first[key].step:
                first[key] = alert
            last[key] = max(last.get(key, alert.step), alert.step)
        if not first:
            return
        rows = {
            (r.kind, r.layer): r
            for r in self.s.scalars(select(LayerAlertRow).where(LayerAlertRow.trial_id == trial_id))
        }
        for key, alert in first.items():
            row = rows.get(key)
            if row is None:
                self.s.add(
                    LayerAlertRow(
                        trial_id=trial_id,
                        kind=key[0],
                        layer=alert.layer,
                        first_step=alert.step,
                        last_step=last[key],
                        value=alert.value,
                        message=alert.message,
                        first_at=now,
                        last_at=now,
                    )
                )
                continue
            if alert.step < row.first_step:  # an earlier step arrived late (a retry)
                row.first_step, row.value, row.message = alert.step, alert.value, alert.message
            if last[key] >= row.last_step:
                row.last_step, row.last_at = last[key], now
        self.s.flush()

    def list_layer_alerts(self, trial_id: int, limit: int = 1000) -> list[LayerAlertRecord]:
        rows = self.s.scalars(
            select(LayerAlertRow)
            .where(LayerAlertRow.trial_id == trial_id)
            .order_by(LayerAlertRow.first_step, LayerAlertRow.id)
            .limit(limit)
        )
        return [
            LayerAlertRecord(
                r.kind,
                r.layer,
                r.first_step,
                r.last_step,
                r.value,
                r.message,
                r.first_at,
                r.last_at,
            )
            for r in rows
        ]
