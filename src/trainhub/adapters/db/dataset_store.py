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
    or_,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from trainhub.adapters.db.models import Base, TenantRow
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

    def _records(self, session: Session, rows: Sequence[DatasetRow]) -> list[Dataset]:
        if not rows:
            return []
        names = {t.id: t.name for t in session.scalars(select(TenantRow))}
        ids = [r.id for r in rows]
        versions: dict[int, list[DatasetVersionRow]] = {i: [] for i in ids}
        for v in session.scalars(
            select(DatasetVersionRow)
            .where(DatasetVersionRow.dataset_id.in_(ids))
            .order_by(DatasetVersionRow.version)
        ):
            versions[v.dataset_id].append(v)
        shares: dict[int, list[str]] = {i: [] for i in ids}
        for s in session.scalars(
            select(DatasetShareRow).where(DatasetShareRow.dataset_id.in_(ids))
        ):
            shares[s.dataset_id].append(names[s.tenant_id])
        out = []
        for r in rows:
            tenant = names[r.tenant_id]
            out.append(
                Dataset(
                    r.id,
                    r.name,
                    tenant,
                    r.created_at,
                    r.created_by,
                    tuple(sorted(shares[r.id])),
                    tuple(_version(v, r.name, tenant) for v in versions[r.id]),
                )
            )
        return out

    def find_datasets(self, name: str, tenant: str | None = None) -> list[Dataset]:
        with Session(self.engine) as session:
            query = select(DatasetRow).where(DatasetRow.name == name)
            if tenant is not None:
                query = query.join(TenantRow, TenantRow.id == DatasetRow.tenant_id).where(
                    TenantRow.name == tenant
                )
            return self._records(session, session.scalars(query).all())

    def list_datasets(self, tenants: Sequence[str] | None, limit: int) -> list[Dataset]:
        with Session(self.engine) as session:
            query = select(DatasetRow).order_by(DatasetRow.name, DatasetRow.id)
            if tenants is not None:
                tenant_ids = select(TenantRow.id).where(TenantRow.name.in_(list(tenants)))
                shared = select(DatasetShareRow.dataset_id).where(
                    DatasetShareRow.tenant_id.in_(tenant_ids)
                )
                query = query.where(
                    or_(DatasetRow.tenant_id.in_(tenant_ids), DatasetRow.id.in_(shared))
                )
            return self._records(session, session.scalars(query.limit(limit)).all())

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
        with Session(self.engine) as session, session.begin():
            tenant_id = session.scalars(select(TenantRow.id).where(TenantRow.name == tenant)).one()
            row = session.get(DatasetShareRow, (dataset_id, tenant_id))
            if shared and row is None:
                session.add(DatasetShareRow(dataset_id=dataset_id, tenant_id=tenant_id))
            elif not shared and row is not None:
                session.delete(row)

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
