"""Admin controls (cordon, drain) and health history of nodes, in the database (migration 0006)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, Boolean, Engine, Float, Integer, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base
from trainhub.service.monitoring import NodeControl


class NodeControlRow(Base):
    __tablename__ = "node_controls"
    node_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[float] = mapped_column(Float)


class NodeHealthEventRow(Base):
    __tablename__ = "node_health_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(String(128), index=True)
    at: Mapped[float] = mapped_column(Float)
    healthy: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)


class NodeLabelRow(Base):
    """Labels set with `trainhub nodes label` (migration 0020): topology levels and others."""

    __tablename__ = "node_labels"
    node_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float)


class SqlNodeControlStore:
    """:class:`~trainhub.service.monitoring.NodeControlStore` on SQLAlchemy; short transactions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def node_controls(self) -> dict[str, NodeControl]:
        with Session(self.engine) as session:
            rows = session.scalars(select(NodeControlRow)).all()
            return {
                r.node_id: NodeControl(r.node_id, r.cordoned, r.draining, r.reason, r.updated_at)
                for r in rows
            }

    def set_node_control(self, control: NodeControl) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(NodeControlRow, control.node_id)
            if row is None:
                row = NodeControlRow(node_id=control.node_id)
                session.add(row)
            row.cordoned = control.cordoned
            row.draining = control.draining
            row.reason = control.reason
            row.updated_at = control.updated_at

    def add_health_event(self, node_id: str, at: float, healthy: bool, reason: str) -> None:
        with Session(self.engine) as session, session.begin():
            session.add(NodeHealthEventRow(node_id=node_id, at=at, healthy=healthy, reason=reason))

    def health_events(self, node_id: str, limit: int) -> list[tuple[float, bool, str]]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(NodeHealthEventRow)
                .where(NodeHealthEventRow.node_id == node_id)
                .order_by(NodeHealthEventRow.at.desc(), NodeHealthEventRow.id.desc())
                .limit(limit)
            ).all()
            return [(r.at, r.healthy, r.reason) for r in rows]

    def node_labels(self) -> dict[str, dict[str, str]]:
        with Session(self.engine) as session:
            rows = session.scalars(select(NodeLabelRow)).all()
            return {r.node_id: {str(k): str(v) for k, v in r.labels.items()} for r in rows}

    def set_node_labels(self, node_id: str, labels: Mapping[str, str], at: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(NodeLabelRow, node_id)
            if row is None:
                row = NodeLabelRow(node_id=node_id)
                session.add(row)
            row.labels = dict(labels)
            row.updated_at = at
