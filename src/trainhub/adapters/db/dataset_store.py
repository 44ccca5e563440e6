"""The datasets' tables (migration 0015) and :class:`~trainhub.service.datasets.DatasetStore`
on SQLAlchemy, in short transactions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import (
    BigInteger,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, TenantRow
from trainhub.adapters.db.tenant_assets import AssetTables
from trainhub.service.datasets import Dataset, DatasetVersion


class DatasetRow(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class DatasetVersionRow(Base):
    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(512), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class DatasetShareRow(Base):
    __tablename__ = "dataset_shares"
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )


class SqlDatasetStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tables: AssetTables[Dataset, DatasetVersion] = AssetTables(
            engine,
            asset=DatasetRow,
            version=DatasetVersionRow,
            share=DatasetShareRow,
            key="dataset_id",
            record=_dataset,
            version_record=_version,
        )

    def find_datasets(self, name: str, tenant: str | None = None) -> list[Dataset]:
        return self.tables.find(name, tenant)

    def list_datasets(self, tenants: Sequence[str] | None, limit: int) -> list[Dataset]:
        return self.tables.listed(tenants, limit)

    def add_version(
        self,
        tenant: str,
        name: str,
        sha256: str,
        size_bytes: int,
        storage_key: str,
        created_by: str,
        now: float,
    ) -> tuple[DatasetVersion, bool]:
        with Session(self.engine) as session, session.begin():
            tenant_row = session.scalars(select(TenantRow).where(TenantRow.name == tenant)).one()
            dataset = session.scalars(
                select(DatasetRow).where(
                    DatasetRow.tenant_id == tenant_row.id, DatasetRow.name == name
                )
            ).one_or_none()
            if dataset is None:
                dataset = DatasetRow(
                    tenant_id=tenant_row.id, name=name, created_at=now, created_by=created_by
                )
                session.add(dataset)
                session.flush()
            latest = session.scalars(
                select(DatasetVersionRow)
                .where(DatasetVersionRow.dataset_id == dataset.id)
                .order_by(DatasetVersionRow.version.desc())
                .limit(1)
            ).one_or_none()
            if latest is not None and latest.sha256 == sha256:
                return _version(latest, name, tenant), False  # nothing changed
            row = DatasetVersionRow(
                dataset_id=dataset.id,
                version=(latest.version if latest else 0) + 1,
                sha256=sha256,
                size_bytes=size_bytes,
                storage_key=storage_key,
                created_at=now,
                created_by=created_by,
            )
            session.add(row)
            session.flush()
            return _version(row, name, tenant), True

    def delete(self, dataset_id: int, version: int | None) -> list[str]:
        with Session(self.engine) as session, session.begin():
            query = select(DatasetVersionRow).where(DatasetVersionRow.dataset_id == dataset_id)
            if version is not None:
                query = query.where(DatasetVersionRow.version == version)
            rows = session.scalars(query).all()
            keys = {r.storage_key for r in rows}
            for r in rows:
                session.delete(r)
            if version is None:
                for share in session.scalars(
                    select(DatasetShareRow).where(DatasetShareRow.dataset_id == dataset_id)
                ):
                    session.delete(share)
                dataset = session.get(DatasetRow, dataset_id)
                if dataset is not None:
                    session.delete(dataset)
            session.flush()
            used = set(
                session.scalars(
                    select(DatasetVersionRow.storage_key).where(
                        DatasetVersionRow.storage_key.in_(keys)
                    )
                )
            )
            return sorted(keys - used)

    def set_share(self, dataset_id: int, tenant: str, shared: bool) -> None:
        self.tables.set_share(dataset_id, tenant, shared)

    def bytes_of_tenant(self, tenant: str) -> int:
        with Session(self.engine) as session:
            distinct = (
                select(
                    DatasetVersionRow.storage_key,
                    func.max(DatasetVersionRow.size_bytes).label("size"),
                )
                .join(DatasetRow, DatasetRow.id == DatasetVersionRow.dataset_id)
                .join(TenantRow, TenantRow.id == DatasetRow.tenant_id)
                .where(TenantRow.name == tenant)
                .group_by(DatasetVersionRow.storage_key)
                .subquery()
            )
            total = session.scalar(select(func.coalesce(func.sum(distinct.c.size), 0)))
            return int(total or 0)


def _dataset(
    row: DatasetRow,
    tenant: str,
    shared_with: tuple[str, ...],
    versions: tuple[DatasetVersion, ...],
) -> Dataset:
    return Dataset(row.id, row.name, tenant, row.created_at, row.created_by, shared_with, versions)


def _version(row: DatasetVersionRow, name: str, tenant: str) -> DatasetVersion:
    return DatasetVersion(
        row.id,
        name,
        tenant,
        row.version,
        row.sha256,
        row.size_bytes,
        row.storage_key,
        row.created_at,
        row.created_by,
    )
