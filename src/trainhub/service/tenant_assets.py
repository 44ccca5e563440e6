"""A tenant's named, versioned, shareable assets, as the model registry and datasets serve them.

:class:`TenantAssets` holds what the two services did alike: finding the asset a name means
for a principal (or a tenant), hiding from other tenants whom else it is shared with, and
sharing (tenant admins only, with a tenant that exists). The rules are pure
(``trainhub.core.tenant_assets``); the rows behind it are one adapter
(``adapters/db/tenant_assets.py``), which each kind's store uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Generic, Protocol, TypeVar

from trainhub.core.errors import NotFound, PermissionDenied
from trainhub.core.tenant_assets import Asset, pick, share_refusal, shares_seen
from trainhub.service.auth import require_user
from trainhub.service.ports import Principal
from trainhub.service.repository import UnitOfWork


class SharedAsset(Asset, Protocol):
    """An asset record: a frozen dataclass (a model, a dataset) with its row's id."""

    @property
    def id(self) -> int: ...


A = TypeVar("A", bound=SharedAsset)


def readable_tenants(principal: Principal) -> list[str] | None:
    """The tenants whose assets ``principal`` reads (None: every tenant, a cluster admin)."""
    return None if principal.is_admin else sorted(principal.roles)


class TenantAssets(Generic[A]):
    """Finding, showing and sharing the assets of one kind (``kind``: "model", "dataset").

    Args:
        find: the assets called NAME (of tenant TENANT only, when given), from the store.
        set_share: share asset ID with TENANT, or stop, in the store.
        listing: the CLI command that lists them, for hints (``trainhub models ls``).
        share_limit: how many tenants one asset may be shared with.
    """

    def __init__(
        self,
        uow: UnitOfWork,
        find: Callable[[str, str | None], list[A]],
        set_share: Callable[[int, str, bool], None],
        *,
        kind: str,
        listing: str,
        share_limit: int,
    ) -> None:
        self.uow = uow
        self._find = find
        self._set_share = set_share
        self.kind = kind
        self.listing = listing
        self.share_limit = share_limit

    def find(
        self,
        name: str,
        owner: str | None,
        tenants: Sequence[str] | None,
        what: str = "",
        ref: str | None = None,
    ) -> A:
        """The one asset called ``name`` (of tenant ``owner``, if given) that members of
        ``tenants`` see (every one when None), their own first. The NotFound message names it
        as ``ref`` (default ``[OWNER/]NAME``), then ``what`` (" or is not shared with ...")."""
        ref = ref or (f"{owner}/{name}" if owner else name)
        missing = (f"{self.kind} {ref} does not exist{what}", f"see `{self.listing}`")
        return pick(self._find(name, owner), tenants, self.kind, missing)

    def get(self, principal: Principal, name: str, owner: str | None) -> A:
        """The asset ``name`` as ``principal`` sees it (shares hidden as :meth:`hide_shares`)."""
        require_user(principal)
        return self.hide_shares(principal, self.find(name, owner, readable_tenants(principal)))

    def hide_shares(self, principal: Principal, asset: A) -> A:
        """Other tenants see that it is shared with them, not with whom else."""
        seen = shares_seen(asset, principal.is_admin, principal.roles)
        if seen == asset.shared_with:
            return asset
        return replace(asset, shared_with=seen)  # type: ignore[type-var]

    def share(self, principal: Principal, asset: A, name: str, tenant: str, shared: bool) -> None:
        """Share ``asset`` (asked for as ``name``, already read by ``principal``) with
        ``tenant``, or stop: admins of its tenant (and cluster admins) only."""
        if not principal.is_admin and principal.roles.get(asset.tenant) != "admin":
            raise PermissionDenied(
                f"only admins of tenant {asset.tenant!r} share its {self.kind}s",
                "ask a tenant admin",
            )
        with self.uow() as repo:
            if repo.get_tenant(tenant) is None:
                raise NotFound(f"tenant {tenant!r} does not exist")
        refused = share_refusal(self.kind, name, asset, tenant, shared, self.share_limit)
        if refused is not None:
            raise refused
        self._set_share(asset.id, tenant, shared)
