"""The tables of a tenant's named, versioned, shareable asset, read and shared in one place.

Registered models (``registry_store.py``) and datasets (``dataset_store.py``) each have three
tables of the same shape: the assets (a tenant, a name unique in it), their versions (numbered
per asset) and their shares (an asset, a tenant). :class:`AssetTables` reads an asset with its
versions and shares, finds assets by name, lists those a set of tenants sees, and shares; each
store keeps what is its own (how a version is added, removed and counted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Engine, or_, select, true
from sqlalchemy.orm import Session

from trainhub.adapters.db.models import TenantRow

A = TypeVar("A")  # the asset record (RegisteredModel, Dataset)
V = TypeVar("V")  # the version record (ModelVersion, DatasetVersion)


class AssetTables(Generic[A, V]):
    """Args:
    asset, version, share: the row classes (``version`` and ``share`` refer to the asset by
        the column ``key``; ``share`` has ``tenant_id``).
    record: an asset record from its row, its tenant's name, the tenants it is shared with
        (sorted) and its versions' records (by number).
    version_record: a version record from its row, the asset's name and tenant.
    live: which version rows count (e.g. not deleted); every one when None.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        asset: Any,
        version: Any,
        share: Any,
        key: str,
        record: Callable[[Any, str, tuple[str, ...], tuple[V, ...]], A],
        version_record: Callable[[Any, str, str], V],
        live: Callable[[], ColumnElement[bool]] | None = None,
    ) -> None:
        self.engine = engine
        self.asset = asset
        self.version = version
        self.share = share
        self.key = key
        self.record = record
        self.version_record = version_record
        self.live = live or true

    def tenant_names(self, session: Session) -> dict[int, str]:
        return {t.id: t.name for t in session.scalars(select(TenantRow))}

    def records(self, session: Session, rows: Sequence[Any]) -> list[A]:
        """The records of asset ``rows``, with their versions and shares, in one read each."""
        if not rows:
            return []
        names = self.tenant_names(session)
        ids = [r.id for r in rows]
        version_key = getattr(self.version, self.key)
        versions: dict[int, list[Any]] = {i: [] for i in ids}
        for v in session.scalars(
            select(self.version)
            .where(version_key.in_(ids), self.live())
            .order_by(self.version.version)
        ):
            versions[getattr(v, self.key)].append(v)
        shares: dict[int, list[str]] = {i: [] for i in ids}
        share_key = getattr(self.share, self.key)
        for s in session.scalars(select(self.share).where(share_key.in_(ids))):
            shares[getattr(s, self.key)].append(names[s.tenant_id])
        out = []
        for r in rows:
            tenant = names[r.tenant_id]
            made = tuple(self.version_record(v, r.name, tenant) for v in versions[r.id])
            out.append(self.record(r, tenant, tuple(sorted(shares[r.id])), made))
        return out

    def find(self, name: str, tenant: str | None = None) -> list[A]:
        """Assets called ``name`` (in ``tenant`` only, if given)."""
        with Session(self.engine) as session:
            query = select(self.asset).where(self.asset.name == name)
            if tenant is not None:
                query = query.join(TenantRow, TenantRow.id == self.asset.tenant_id).where(
                    TenantRow.name == tenant
                )
            return self.records(session, session.scalars(query).all())

    def listed(self, tenants: Sequence[str] | None, limit: int) -> list[A]:
        """Assets owned by or shared with ``tenants`` (all when None), by name."""
        with Session(self.engine) as session:
            query = select(self.asset).order_by(self.asset.name, self.asset.id)
            if tenants is not None:
                tenant_ids = select(TenantRow.id).where(TenantRow.name.in_(list(tenants)))
                shared = select(getattr(self.share, self.key)).where(
                    self.share.tenant_id.in_(tenant_ids)
                )
                query = query.where(
                    or_(self.asset.tenant_id.in_(tenant_ids), self.asset.id.in_(shared))
                )
            return self.records(session, session.scalars(query.limit(limit)).all())

    def set_share(self, asset_id: int, tenant: str, shared: bool) -> None:
        """Share asset ``asset_id`` with ``tenant`` (idempotent), or stop."""
        with Session(self.engine) as session, session.begin():
            tenant_id = session.scalars(select(TenantRow.id).where(TenantRow.name == tenant)).one()
            row = session.get(self.share, (asset_id, tenant_id))
            if shared and row is None:
                session.add(self.share(**{self.key: asset_id, "tenant_id": tenant_id}))
            elif not shared and row is not None:
                session.delete(row)
