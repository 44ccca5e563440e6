"""The session limits table (migration 0019) and
:class:`~trainhub.service.sessions.SessionLimitStore` on SQLAlchemy."""

from __future__ import annotations

from sqlalchemy import Engine, Float, ForeignKey, Integer, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, TenantRow
from trainhub.core.errors import NotFound
from trainhub.core.session_spec import SessionLimits


class SessionLimitRow(Base):
    __tablename__ = "session_limits"
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_length_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class SqlSessionLimitStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def session_limits(self, tenant: str) -> SessionLimits:
        with Session(self.engine) as session:
            row = session.execute(
                select(SessionLimitRow)
                .join(TenantRow, TenantRow.id == SessionLimitRow.tenant_id)
                .where(TenantRow.name == tenant)
            ).scalar_one_or_none()
            if row is None:
                return SessionLimits()
            return SessionLimits(row.max_gpus, row.max_length_s)

    def set_session_limits(self, tenant: str, limits: SessionLimits) -> None:
        with Session(self.engine) as session, session.begin():
            tenant_id = session.scalar(select(TenantRow.id).where(TenantRow.name == tenant))
            if tenant_id is None:
                raise NotFound(f"tenant {tenant!r} does not exist")
            row = session.get(SessionLimitRow, tenant_id)
            if row is None:
                row = SessionLimitRow(tenant_id=tenant_id)
                session.add(row)
            row.max_gpus = limits.max_gpus
            row.max_length_s = limits.max_length_s
