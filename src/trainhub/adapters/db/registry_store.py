"""The model registry's tables (migration 0009) and :class:`~trainhub.service.registry.ModelStore`
on SQLAlchemy, in short transactions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, TenantRow
from trainhub.service.registry import ModelVersion, NewVersion, RegisteredModel


class RegisteredModelRow(Base):
    __tablename__ = "registered_models"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class ModelVersionRow(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registered_models.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    storage_key: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    arch: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    lineage: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    # set when deleted (migration 0016): the row stays so its number is never reused
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)


class ModelShareRow(Base):
    __tablename__ = "model_shares"
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registered_models.id", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )


class SqlModelStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _tenant_names(self, session: Session) -> dict[int, str]:
        return {t.id: t.name for t in session.scalars(select(TenantRow))}

    def _records(
        self, session: Session, rows: Sequence[RegisteredModelRow]
    ) -> list[RegisteredModel]:
        if not rows:
            return []
        names = self._tenant_names(session)
        ids = [r.id for r in rows]
        versions: dict[int, list[ModelVersionRow]] = {i: [] for i in ids}
        for v in session.scalars(
            select(ModelVersionRow)
            .where(ModelVersionRow.model_id.in_(ids), ModelVersionRow.deleted_at.is_(None))
            .order_by(ModelVersionRow.version)
        ):
            versions[v.model_id].append(v)
        shares: dict[int, list[str]] = {i: [] for i in ids}
        for s in session.scalars(select(ModelShareRow).where(ModelShareRow.model_id.in_(ids))):
            shares[s.model_id].append(names[s.tenant_id])
        out = []
        for r in rows:
            tenant = names[r.tenant_id]
            out.append(
                RegisteredModel(
                    r.id,
                    r.name,
                    tenant,
                    r.description,
                    r.created_at,
                    r.created_by,
                    tuple(sorted(shares[r.id])),
                    tuple(_version(v, r.name, tenant) for v in versions[r.id]),
                )
            )
        return out

    def find_models(self, name: str, tenant: str | None = None) -> list[RegisteredModel]:
        with Session(self.engine) as session:
            query = select(RegisteredModelRow).where(RegisteredModelRow.name == name)
            if tenant is not None:
                query = query.join(TenantRow, TenantRow.id == RegisteredModelRow.tenant_id).where(
                    TenantRow.name == tenant
                )
            return self._records(session, session.scalars(query).all())

    def list_models(self, tenants: Sequence[str] | None, limit: int) -> list[RegisteredModel]:
        with Session(self.engine) as session:
            query = select(RegisteredModelRow).order_by(
                RegisteredModelRow.name, RegisteredModelRow.id
            )
            if tenants is not None:
                tenant_ids = select(TenantRow.id).where(TenantRow.name.in_(list(tenants)))
                shared = select(ModelShareRow.model_id).where(
                    ModelShareRow.tenant_id.in_(tenant_ids)
                )
                query = query.where(
                    or_(
                        RegisteredModelRow.tenant_id.in_(tenant_ids),
                        RegisteredModelRow.id.in_(shared),
                    )
                )
            return self._records(session, session.scalars(query.limit(limit)).all())

    def add_version(
        self,
        tenant: str,
        name: str,
        description: str,
        storage_key: str,
        size_bytes: int,
        new: NewVersion,
        created_by: str,
        now: float,
    ) -> ModelVersion:
        with Session(self.engine) as session, session.begin():
            tenant_row = session.scalars(select(TenantRow).where(TenantRow.name == tenant)).one()
            model = session.scalars(
                select(RegisteredModelRow).where(
                    RegisteredModelRow.tenant_id == tenant_row.id, RegisteredModelRow.name == name
                )
            ).one_or_none()
            if model is None:
                model = RegisteredModelRow(
                    tenant_id=tenant_row.id,
                    name=name,
                    description=description,
                    created_at=now,
                    created_by=created_by,
                )
                session.add(model)
                session.flush()
            elif description:
                model.description = description
            top = session.scalar(
                select(func.max(ModelVersionRow.version)).where(
                    ModelVersionRow.model_id == model.id
                )
            )
            row = ModelVersionRow(
                model_id=model.id,
                version=(top or 0) + 1,
                storage_key=storage_key,
                size_bytes=size_bytes,
                arch=new.arch,
                metrics=new.metrics,
                hparams=new.hparams,
                lineage=new.lineage,
                created_at=now,
                created_by=created_by,
            )
            session.add(row)
            session.flush()
            return _version(row, name, tenant)

    def set_share(self, model_id: int, tenant: str, shared: bool) -> None:
        with Session(self.engine) as session, session.begin():
            tenant_id = session.scalars(select(TenantRow.id).where(TenantRow.name == tenant)).one()
            row = session.get(ModelShareRow, (model_id, tenant_id))
            if shared and row is None:
                session.add(ModelShareRow(model_id=model_id, tenant_id=tenant_id))
            elif not shared and row is not None:
                session.delete(row)

    def bytes_of_tenant(self, tenant: str) -> int:
        with Session(self.engine) as session:
            total = session.scalar(
                select(func.coalesce(func.sum(ModelVersionRow.size_bytes), 0))
                .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
                .join(TenantRow, TenantRow.id == RegisteredModelRow.tenant_id)
                .where(TenantRow.name == tenant, ModelVersionRow.deleted_at.is_(None))
            )
            return int(total or 0)

    def delete_version(self, version_id: int, now: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ModelVersionRow, version_id)
            if row is not None and row.deleted_at is None:
                row.deleted_at = now


def _version(row: ModelVersionRow, name: str, tenant: str) -> ModelVersion:
    return ModelVersion(
        row.id,
        name,
        tenant,
        row.version,
        row.storage_key,
        row.size_bytes,
        dict(row.arch),
        dict(row.metrics),
        dict(row.hparams),
        dict(row.lineage),
        row.created_at,
        row.created_by,
    )
