"""Tenants, users, memberships, tokens, and the caller's identity."""

from __future__ import annotations

from fastapi import APIRouter, Response

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import Name, TokenId, errors
from trainhub.api.schemas import (
    ClusterPublic,
    MembershipSet,
    MePublic,
    NodePublic,
    StorageQuotasIn,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    TokenCreate,
    TokenIssued,
    TokenPublic,
    TokensPublic,
    UserCreate,
    UserPublic,
    UsersPublic,
)
from trainhub.service.admin import QuotaChange
from trainhub.service.auth import require_user

router = APIRouter(tags=["admin"])


def _quotas(body: StorageQuotasIn, clear: bool = False) -> QuotaChange:
    return QuotaChange(
        body.max_checkpoint_bytes, body.max_trial_storage_bytes, body.max_storage_bytes, clear
    )


@router.get("/me", response_model=MePublic, responses=errors())
def me(principal: CurrentPrincipal) -> MePublic:
    require_user(principal)
    return MePublic(
        username=principal.username, is_admin=principal.is_admin, roles=dict(principal.roles)
    )


@router.get("/tenants", response_model=TenantsPublic, responses=errors())
def list_tenants(services: ServicesDep, principal: CurrentPrincipal) -> TenantsPublic:
    rows = services.admin.list_tenants(principal)
    return TenantsPublic(data=[TenantPublic.of(t) for t in rows], count=len(rows))


@router.post("/tenants", status_code=201, response_model=TenantPublic, responses=errors(409, 411))
def create_tenant(
    services: ServicesDep, principal: CurrentPrincipal, body: TenantCreate
) -> TenantPublic:
    tenant = services.admin.create_tenant(
        principal, body.name, body.guaranteed_slots, body.limit_slots, body.weight, _quotas(body)
    )
    return TenantPublic.of(tenant)


@router.patch("/tenants/{name}", response_model=TenantPublic, responses=errors(404, 411))
def update_tenant(
    services: ServicesDep, principal: CurrentPrincipal, name: Name, body: TenantUpdate
) -> TenantPublic:
    tenant = services.admin.update_tenant(
        principal,
        name,
        body.guaranteed_slots,
        body.limit_slots,
        body.weight,
        body.clear_limit,
        _quotas(body, clear=body.clear_storage_quotas),
    )
    return TenantPublic.of(tenant)


@router.get("/users", response_model=UsersPublic, responses=errors())
def list_users(services: ServicesDep, principal: CurrentPrincipal) -> UsersPublic:
    rows = services.admin.list_users(principal)
    return UsersPublic(data=[UserPublic.of(u) for u in rows], count=len(rows))


@router.post("/users", status_code=201, response_model=UserPublic, responses=errors(409, 411))
def create_user(services: ServicesDep, principal: CurrentPrincipal, body: UserCreate) -> UserPublic:
    return UserPublic.of(services.admin.create_user(principal, body.username, body.is_admin))


@router.put("/users/{username}/memberships", response_model=UserPublic, responses=errors(404, 411))
def set_membership(
    services: ServicesDep, principal: CurrentPrincipal, username: Name, body: MembershipSet
) -> UserPublic:
    return UserPublic.of(services.admin.set_membership(principal, username, body.tenant, body.role))


@router.delete("/users/{username}/memberships/{tenant}", status_code=204, responses=errors(404))
def remove_membership(
    services: ServicesDep, principal: CurrentPrincipal, username: Name, tenant: Name
) -> Response:
    services.admin.remove_membership(principal, username, tenant)
    return Response(status_code=204)


@router.get("/tokens", response_model=TokensPublic, responses=errors())
def list_tokens(services: ServicesDep, principal: CurrentPrincipal) -> TokensPublic:
    rows = services.admin.list_tokens(principal)
    return TokensPublic(data=[TokenPublic.of(t) for t in rows], count=len(rows))


@router.post("/tokens", status_code=201, response_model=TokenIssued, responses=errors(404, 411))
def create_token(
    services: ServicesDep, principal: CurrentPrincipal, body: TokenCreate
) -> TokenIssued:
    issued = services.admin.issue_token(principal, body.name, body.username, body.ttl_s)
    return TokenIssued(**TokenPublic.of(issued.token).model_dump(), token=issued.secret)


@router.delete("/tokens/{token_id}", status_code=204, responses=errors(404))
def revoke_token(services: ServicesDep, principal: CurrentPrincipal, token_id: TokenId) -> Response:
    services.admin.revoke_token(principal, token_id)
    return Response(status_code=204)


@router.get("/cluster", response_model=ClusterPublic, responses=errors())
def cluster(services: ServicesDep, principal: CurrentPrincipal) -> ClusterPublic:
    require_user(principal)
    nodes = services.cluster_nodes()
    agents = services.monitoring.inventories() if services.monitoring is not None else {}
    return ClusterPublic(
        nodes=[NodePublic.of(n, agents.get(n.node_id)) for n in nodes],
        total_gpus=sum(n.total_gpus for n in nodes),
        total_cpus=sum(n.total_cpus for n in nodes),
        sandbox=services.sandbox,
        warnings=list(services.warnings),
    )
