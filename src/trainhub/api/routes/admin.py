"""Tenants, users, memberships, tokens, and the caller's identity."""

from __future__ import annotations

from fastapi import APIRouter, Response

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.schemas import (
    ClusterPublic,
    MembershipSet,
    MePublic,
    NodePublic,
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
from trainhub.service.auth import require_user

router = APIRouter(tags=["admin"])


@router.get("/me", response_model=MePublic)
def me(principal: CurrentPrincipal) -> MePublic:
    require_user(principal)
    return MePublic(
        username=principal.username, is_admin=principal.is_admin, roles=dict(principal.roles)
    )


@router.get("/tenants", response_model=TenantsPublic)
def list_tenants(services: ServicesDep, principal: CurrentPrincipal) -> TenantsPublic:
    rows = services.admin.list_tenants(principal)
    return TenantsPublic(data=[TenantPublic.of(t) for t in rows], count=len(rows))


@router.post("/tenants", status_code=201, response_model=TenantPublic)
def create_tenant(
    services: ServicesDep, principal: CurrentPrincipal, body: TenantCreate
) -> TenantPublic:
    tenant = services.admin.create_tenant(
        principal, body.name, body.guaranteed_slots, body.limit_slots, body.weight
    )
    return TenantPublic.of(tenant)


@router.patch("/tenants/{name}", response_model=TenantPublic)
def update_tenant(
    services: ServicesDep, principal: CurrentPrincipal, name: str, body: TenantUpdate
) -> TenantPublic:
    tenant = services.admin.update_tenant(
        principal, name, body.guaranteed_slots, body.limit_slots, body.weight, body.clear_limit
    )
    return TenantPublic.of(tenant)


@router.get("/users", response_model=UsersPublic)
def list_users(services: ServicesDep, principal: CurrentPrincipal) -> UsersPublic:
    rows = services.admin.list_users(principal)
    return UsersPublic(data=[UserPublic.of(u) for u in rows], count=len(rows))


@router.post("/users", status_code=201, response_model=UserPublic)
def create_user(services: ServicesDep, principal: CurrentPrincipal, body: UserCreate) -> UserPublic:
    return UserPublic.of(services.admin.create_user(principal, body.username, body.is_admin))


@router.put("/users/{username}/memberships", response_model=UserPublic)
def set_membership(
    services: ServicesDep, principal: CurrentPrincipal, username: str, body: MembershipSet
) -> UserPublic:
    return UserPublic.of(services.admin.set_membership(principal, username, body.tenant, body.role))


@router.delete("/users/{username}/memberships/{tenant}", status_code=204)
def remove_membership(
    services: ServicesDep, principal: CurrentPrincipal, username: str, tenant: str
) -> Response:
    services.admin.remove_membership(principal, username, tenant)
    return Response(status_code=204)


@router.get("/tokens", response_model=TokensPublic)
def list_tokens(services: ServicesDep, principal: CurrentPrincipal) -> TokensPublic:
    rows = services.admin.list_tokens(principal)
    return TokensPublic(data=[TokenPublic.of(t) for t in rows], count=len(rows))


@router.post("/tokens", status_code=201, response_model=TokenIssued)
def create_token(
    services: ServicesDep, principal: CurrentPrincipal, body: TokenCreate
) -> TokenIssued:
    issued = services.admin.issue_token(principal, body.name, body.username, body.ttl_s)
    return TokenIssued(**TokenPublic.of(issued.token).model_dump(), token=issued.secret)


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(services: ServicesDep, principal: CurrentPrincipal, token_id: int) -> Response:
    services.admin.revoke_token(principal, token_id)
    return Response(status_code=204)


@router.get("/cluster", response_model=ClusterPublic)
def cluster(services: ServicesDep, principal: CurrentPrincipal) -> ClusterPublic:
    require_user(principal)
    nodes = services.cluster_nodes()
    return ClusterPublic(
        nodes=[NodePublic.of(n) for n in nodes],
        total_gpus=sum(n.total_gpus for n in nodes),
        total_cpus=sum(n.total_cpus for n in nodes),
        sandbox=services.sandbox,
        warnings=list(services.warnings),
    )
