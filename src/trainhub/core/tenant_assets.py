"""The rules of a tenant's named, versioned, shareable asset: registered models and datasets.

An asset belongs to one tenant and has versions 1, 2, ...; its tenant's admins share it with
other tenants. Who sees it, which one a name means, which version a number means, and when a
share is refused are the same for every kind of asset and are written here once, pure; the
services (service/registry.py, service/datasets.py) add permissions and storage, through
:class:`trainhub.service.tenant_assets.TenantAssets`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar

from trainhub.core.errors import InvalidRequest, NotFound


class Version(Protocol):
    @property
    def version(self) -> int: ...


class Asset(Protocol):
    """What the rules read of an asset (a model, a dataset)."""

    @property
    def name(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def shared_with(self) -> tuple[str, ...]: ...


A = TypeVar("A", bound=Asset)
V = TypeVar("V", bound=Version)


def visible_to(asset: Asset, tenants: Collection[str] | None) -> bool:
    """Whether members of ``tenants`` (everyone when None: a cluster admin) see ``asset``:
    they own it, or it is shared with one of them."""
    return tenants is None or asset.tenant in tenants or bool(set(asset.shared_with) & set(tenants))


def pick(
    found: Sequence[A],
    tenants: Collection[str] | None,
    kind: str,
    missing: tuple[str, str],
) -> A:
    """The one asset a name means among ``found`` (the assets of that name) for readers in
    ``tenants``: their own first, then one shared with them.

    Args:
        kind: "model", "dataset": the word of the messages.
        missing: the NotFound message and hint when none is visible.

    Raises:
        NotFound: no asset of that name is visible.
        InvalidRequest: several are, in different tenants (name the owner).
    """
    seen = [a for a in found if visible_to(a, tenants)]
    if tenants is not None and len(seen) > 1:
        seen = [a for a in seen if a.tenant in tenants] or seen
    if not seen:
        raise NotFound(*missing)
    if len(seen) > 1:
        owners = ", ".join(sorted(a.tenant for a in seen))
        name = seen[0].name
        raise InvalidRequest(
            f"several {kind}s are called {name!r} (tenants {owners})", f"name it TENANT/{name}"
        )
    return seen[0]


def pick_version(versions: Sequence[V], kind: str, name: str, version: int | None) -> V:
    """Version ``version`` of an asset (its latest when None).

    Raises:
        NotFound: it has no versions, or not that one (its versions are listed).
    """
    if version is None:
        if not versions:
            raise NotFound(f"{kind} {name} has no version")
        return max(versions, key=lambda v: v.version)
    for item in versions:
        if item.version == version:
            return item
    have = ", ".join(str(v.version) for v in versions) or "none"
    raise NotFound(f"{kind} {name} has no version {version}", f"its versions: {have}")


def shares_seen(asset: Asset, is_admin: bool, tenants: Collection[str]) -> tuple[str, ...]:
    """The tenants a reader sees ``asset`` shared with: all of them for its own tenant's
    members and cluster admins; another tenant sees that it is shared with it, not with whom
    else."""
    if is_admin or asset.tenant in tenants:
        return asset.shared_with
    return tuple(t for t in asset.shared_with if t in tenants)


def share_refusal(
    kind: str, name: str, asset: Asset, tenant: str, shared: bool, limit: int
) -> InvalidRequest | None:
    """Why sharing ``asset`` (asked for as ``name``) with ``tenant`` is refused, or None: a
    tenant does not share with itself, and an asset is shared with at most ``limit``."""
    if tenant == asset.tenant:
        return InvalidRequest(f"{kind} {name} already belongs to tenant {tenant!r}")
    if shared and len(asset.shared_with) >= limit:
        return InvalidRequest(
            f"{kind} {name} is shared with {len(asset.shared_with)} tenants; the limit is {limit}"
        )
    return None
