"""The model registry's tables (migration 0009) and :class:`~trainhub.service.registry.ModelStore`
on SQLAlchemy, in short transactions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, TenantRow
from trainhub.adapters.db.tenant_assets import AssetTables
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
    # whether the weights load into ``arch`` (migration 0018): None where never checked
    weights_fit: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=None)
    weights_problem: Mapped[str] = mapped_column(Text, default="", server_default="")


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
        self.tables: AssetTables[RegisteredModel, ModelVersion] = AssetTables(
            engine,
            asset=RegisteredModelRow,
            version=ModelVersionRow,
            share=ModelShareRow,
            key="model_id",
            record=_model,
            version_record=_version,
            live=lambda: ModelVersionRow.deleted_at.is_(None),
        )

    def find_models(self, name: str, tenant: str | None = None) -> list[RegisteredModel]:
        return self.tables.find(name, tenant)

    def list_models(self, tenants: Sequence[str] | None, limit: int) -> list[RegisteredModel]:
        return self.tables.listed(tenants, limit)

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
                weights_fit=new.weights_fit,
            )
            session.add(row)
            session.flush()
            return _version(row, name, tenant)

    def set_share(self, model_id: int, tenant: str, shared: bool) -> None:
        self.tables.set_share(model_id, tenant, shared)

    def bytes_of_tenant(self, tenant: str) -> int:
        with Session(self.engine) as session:
            total = session.scalar(
                select(func.coalesce(func.sum(ModelVersionRow.size_bytes), 0))
                .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
                .join(TenantRow, TenantRow.id == RegisteredModelRow.tenant_id)
                .where(TenantRow.name == tenant, ModelVersionRow.deleted_at.is_(None))
            )
            return int(total or 0)

    def unchecked_versions(self, after_id: int, limit: int) -> list[ModelVersion]:
        with Session(self.engine) as session:
            names = self.tables.tenant_names(session)
            rows = session.execute(
                select(ModelVersionRow, RegisteredModelRow)
                .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
                .where(
                    ModelVersionRow.id > after_id,
                    ModelVersionRow.weights_fit.is_(None),
                    ModelVersionRow.deleted_at.is_(None),
                )
                .order_by(ModelVersionRow.id)
                .limit(limit)
            ).all()
            return [_version(v, m.name, names[m.tenant_id]) for v, m in rows]

    def set_weights_fit(self, version_id: int, fit: bool, problem: str) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ModelVersionRow, version_id)
            if row is not None:
                row.weights_fit = fit
                row.weights_problem = problem

    def delete_version(self, version_id: int, now: float) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(ModelVersionRow, version_id)
            if row is not None and row.deleted_at is None:
                row.deleted_at = now


def _model(
    row: RegisteredModelRow,
    tenant: str,
    shared_with: tuple[str, ...],
    versions: tuple[ModelVersion, ...],
) -> RegisteredModel:
    return RegisteredModel(
        row.id, row.name, tenant, row.description, row.created_at, row.created_by,
        shared_with, versions,
    )  # fmt: skip


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
        row.weights_fit,
        row.weights_problem or "",
    )
