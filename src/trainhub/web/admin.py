"""Admin pages: tenants (guarantees, limits, weights, storage quotas), users and their
memberships, tokens (create, revoke). Only admins reach them: every page and form calls the
admin service, which refuses anyone else with 403, as the API does."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from trainhub.api.params import Name, TokenId
from trainhub.api.schemas import (
    MembershipSet,
    TenantCreate,
    TenantPublic,
    TenantUpdate,
    TokenCreate,
    TokenPublic,
    UserCreate,
)
from trainhub.core.errors import InvalidRequest
from trainhub.service.admin import QuotaChange
from trainhub.service.auth import require_admin
from trainhub.service.ports import Principal
from trainhub.web.forms import parse_form
from trainhub.web.site import PREFIX, Site

ADMIN = f"{PREFIX}/admin"


def quotas_of(body: TenantCreate | TenantUpdate) -> QuotaChange:
    clear = isinstance(body, TenantUpdate) and body.clear_storage_quotas
    return QuotaChange(
        body.max_checkpoint_bytes, body.max_trial_storage_bytes, body.max_storage_bytes, clear
    )


def add_admin_routes(router: APIRouter, site: Site) -> None:
    admin = site.services.admin

    # ---------------------------------------------------------------- tenants
    @router.get("/admin/tenants", response_class=HTMLResponse)
    def tenants_page(request: Request) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            require_admin(principal)
            rows = [TenantPublic.of(t) for t in admin.list_tenants(principal)]
            return {"tenants": rows}

        return site.page(request, "admin_tenants.html", build)

    @router.post("/admin/tenants")
    async def create_tenant(request: Request) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            body = parse_form(TenantCreate, form)
            admin.create_tenant(
                principal,
                body.name,
                body.guaranteed_slots,
                body.limit_slots,
                body.weight,
                quotas_of(body),
            )

        return await site.action(request, act, f"{ADMIN}/tenants")

    @router.post("/admin/tenants/{name}")
    async def update_tenant(request: Request, name: Name) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            body = parse_form(TenantUpdate, form, checkboxes=("clear_limit",))
            admin.update_tenant(
                principal,
                name,
                body.guaranteed_slots,
                body.limit_slots,
                body.weight,
                body.clear_limit,
                quotas_of(body),
            )

        return await site.action(request, act, f"{ADMIN}/tenants")

    # ------------------------------------------------------------------ users
    @router.get("/admin/users", response_class=HTMLResponse)
    def users_page(request: Request) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            require_admin(principal)
            return {
                "users": admin.list_users(principal),
                "tenant_names": [t.name for t in admin.list_tenants(principal)],
            }

        return site.page(request, "admin_users.html", build)

    @router.post("/admin/users")
    async def create_user(request: Request) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            body = parse_form(UserCreate, form, checkboxes=("is_admin",))
            admin.create_user(principal, body.username, body.is_admin)

        return await site.action(request, act, f"{ADMIN}/users")

    @router.post("/admin/users/{username}/memberships")
    async def set_membership(request: Request, username: Name) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> None:
            require_admin(principal)
            body = parse_form(MembershipSet, form)
            if form.get("remove"):
                admin.remove_membership(principal, username, body.tenant)
            else:
                admin.set_membership(principal, username, body.tenant, body.role)

        return await site.action(request, act, f"{ADMIN}/users")

    # ----------------------------------------------------------------- tokens
    @router.get("/admin/tokens", response_class=HTMLResponse)
    def tokens_page(request: Request, user: str = Query("", max_length=64)) -> Response:
        def build(principal: Principal) -> dict[str, Any]:
            require_admin(principal)
            username = user or principal.username or ""
            tokens = admin.list_user_tokens(principal, username)
            return {
                "tokens": [TokenPublic.of(t) for t in tokens],
                "username": username,
                "usernames": [u.username for u in admin.list_users(principal)],
            }

        return site.page(request, "admin_tokens.html", build)

    @router.post("/admin/tokens")
    async def create_token(request: Request) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> Response:
            require_admin(principal)
            days = form.pop("ttl_days", "").strip()
            if days:
                try:
                    form["ttl_s"] = str(float(days) * 86400.0)
                except ValueError:
                    raise InvalidRequest("ttl_days: not a number", "e.g. 30, or empty") from None
            body = parse_form(TokenCreate, form)
            issued = admin.issue_token(principal, body.name, body.username, body.ttl_s)
            username = body.username or principal.username or ""
            return site.render(
                request,
                "admin_tokens.html",
                principal,
                {
                    "tokens": [
                        TokenPublic.of(t) for t in admin.list_user_tokens(principal, username)
                    ],
                    "username": username,
                    "usernames": [u.username for u in admin.list_users(principal)],
                    "issued": issued.secret,
                },
            )

        return await site.action(request, act, f"{ADMIN}/tokens")

    @router.post("/admin/tokens/{token_id}/revoke")
    async def revoke_token(request: Request, token_id: TokenId) -> Response:
        def act(principal: Principal, form: dict[str, str]) -> str:
            require_admin(principal)
            admin.revoke_token(principal, token_id)
            user = form.get("user", "")
            return f"{ADMIN}/tokens" + (f"?{urlencode({'user': user[:64]})}" if user else "")

        return await site.action(request, act, f"{ADMIN}/tokens")
