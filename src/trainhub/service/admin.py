"""Use cases of administration: tenants, users, memberships, tokens, first start."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainhub.core.errors import InvalidRequest, NotFound, PermissionDenied
from trainhub.service.auth import Role, new_token, require_admin, require_user
from trainhub.service.clock import Clock
from trainhub.service.ports import Principal
from trainhub.service.records import KEEP, Tenant, TenantUpdate, Token, User
from trainhub.service.repository import UnitOfWork

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class IssuedToken:
    """A new token: ``secret`` is shown once and never stored."""

    token: Token
    secret: str


@dataclass(frozen=True)
class QuotaChange:
    """Storage quotas to set (None: leave as is), or ``clear`` to go back to the defaults."""

    max_checkpoint_bytes: int | None = None
    max_trial_storage_bytes: int | None = None
    max_storage_bytes: int | None = None
    clear: bool = False

    def fields(self) -> dict[str, int | None]:
        names = ("max_checkpoint_bytes", "max_trial_storage_bytes", "max_storage_bytes")
        if self.clear:
            return dict.fromkeys(names)
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


_NO_CHANGE = QuotaChange()


def _check_name(kind: str, name: str) -> None:
    if not NAME.match(name):
        raise InvalidRequest(
            f"{kind} name {name!r} is not allowed",
            "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit",
        )


def _check_share(guaranteed_slots: int, limit_slots: int | None) -> None:
    if limit_slots is not None and limit_slots < guaranteed_slots:
        raise InvalidRequest(
            f"the limit ({limit_slots} slots) is below the guarantee ({guaranteed_slots})",
            "raise the limit or lower the guarantee",
        )


class AdminService:
    def __init__(self, uow: UnitOfWork, clock: Clock) -> None:
        self.uow = uow
        self.clock = clock

    def bootstrap(self) -> IssuedToken | None:
        """On first start: a default tenant and an admin user with a token; None afterwards."""
        now = self.clock()
        with self.uow() as repo:
            if repo.list_users():
                return None
            if repo.get_tenant(DEFAULT_TENANT) is None:
                repo.add_tenant(DEFAULT_TENANT, now)
            admin = repo.add_user("admin", True, now)
            repo.set_membership(admin.id, DEFAULT_TENANT, Role.ADMIN)
            secret, token_hash, prefix = new_token()
            token = repo.add_token(token_hash, prefix, "bootstrap", now, user_id=admin.id)
            return IssuedToken(token, secret)

    # -- tenants --
    def create_tenant(
        self,
        principal: Principal,
        name: str,
        guaranteed_slots: int = 0,
        limit_slots: int | None = None,
        weight: float = 1.0,
        quotas: QuotaChange = _NO_CHANGE,
    ) -> Tenant:
        require_admin(principal)
        _check_name("tenant", name)
        _check_share(guaranteed_slots, limit_slots)
        with self.uow() as repo:
            repo.add_tenant(name, self.clock())
            return repo.update_tenant(
                name,
                TenantUpdate(
                    guaranteed_slots=guaranteed_slots,
                    limit_slots=limit_slots,
                    weight=weight,
                    **quotas.fields(),
                ),
            )

    def update_tenant(
        self,
        principal: Principal,
        name: str,
        guaranteed_slots: int | None = None,
        limit_slots: int | None = None,
        weight: float | None = None,
        clear_limit: bool = False,
        quotas: QuotaChange = _NO_CHANGE,
    ) -> Tenant:
        require_admin(principal)
        update = TenantUpdate(
            guaranteed_slots=KEEP if guaranteed_slots is None else guaranteed_slots,
            limit_slots=limit_slots if limit_slots is not None or clear_limit else KEEP,
            weight=KEEP if weight is None else weight,
            **quotas.fields(),
        )
        with self.uow() as repo:
            current = repo.get_tenant(name)
            if current is None:
                raise NotFound(f"tenant {name!r} does not exist")
            guaranteed = current.guaranteed_slots if guaranteed_slots is None else guaranteed_slots
            limit = current.limit_slots if update.limit_slots is KEEP else limit_slots
            _check_share(guaranteed, limit)
            return repo.update_tenant(name, update)

    def list_tenants(self, principal: Principal) -> list[Tenant]:
        require_user(principal)
        with self.uow() as repo:
            tenants = repo.list_tenants()
        if principal.is_admin:
            return tenants
        return [t for t in tenants if t.name in principal.roles]

    # -- users --
    def create_user(self, principal: Principal, username: str, is_admin: bool = False) -> User:
        require_admin(principal)
        _check_name("user", username)
        with self.uow() as repo:
            return repo.add_user(username, is_admin, self.clock())

    def list_users(self, principal: Principal) -> list[User]:
        require_admin(principal)
        with self.uow() as repo:
            return repo.list_users()

    def set_membership(self, principal: Principal, username: str, tenant: str, role: str) -> User:
        try:
            parsed = Role(role)
        except ValueError:
            raise InvalidRequest(
                f"role {role!r} does not exist", "use admin, member or viewer"
            ) from None
        if not principal.is_admin and principal.roles.get(tenant) != Role.ADMIN:
            raise PermissionDenied(f"only admins of tenant {tenant!r} may change its members")
        with self.uow() as repo:
            user = repo.get_user_by_name(username)
            if user is None:
                raise NotFound(f"user {username!r} does not exist")
            repo.set_membership(user.id, tenant, parsed)
            updated = repo.get_user(user.id)
        assert updated is not None
        return updated

    def remove_membership(self, principal: Principal, username: str, tenant: str) -> None:
        if not principal.is_admin and principal.roles.get(tenant) != Role.ADMIN:
            raise PermissionDenied(f"only admins of tenant {tenant!r} may change its members")
        with self.uow() as repo:
            user = repo.get_user_by_name(username)
            if user is None:
                raise NotFound(f"user {username!r} does not exist")
            repo.remove_membership(user.id, tenant)

    # -- tokens --
    def issue_token(
        self,
        principal: Principal,
        name: str = "",
        username: str | None = None,
        ttl_s: float | None = None,
    ) -> IssuedToken:
        """A token for oneself, or (admins) for another user."""
        require_user(principal)
        now = self.clock()
        with self.uow() as repo:
            if username is not None and username != principal.username:
                require_admin(principal)
                user = repo.get_user_by_name(username)
                if user is None:
                    raise NotFound(f"user {username!r} does not exist")
                user_id = user.id
            else:
                assert principal.user_id is not None
                user_id = principal.user_id
            secret, token_hash, prefix = new_token()
            token = repo.add_token(
                token_hash,
                prefix,
                name,
                now,
                user_id=user_id,
                expires_at=now + ttl_s if ttl_s else None,
            )
        return IssuedToken(token, secret)

    def list_tokens(self, principal: Principal) -> list[Token]:
        require_user(principal)
        assert principal.user_id is not None
        with self.uow() as repo:
            return repo.list_tokens(principal.user_id)

    def list_user_tokens(self, principal: Principal, username: str) -> list[Token]:
        """Admins: the tokens of any user (the dashboard's tokens page)."""
        require_admin(principal)
        with self.uow() as repo:
            user = repo.get_user_by_name(username)
            if user is None:
                raise NotFound(f"user {username!r} does not exist")
            return repo.list_tokens(user.id)

    def revoke_token(self, principal: Principal, token_id: int) -> None:
        require_user(principal)
        with self.uow() as repo:
            token = repo.get_token(token_id)
            if token is None or (token.user_id != principal.user_id and not principal.is_admin):
                raise NotFound(f"token {token_id} does not exist")
            repo.revoke_token(token_id)

    def whoami(self, principal: Principal) -> Principal:
        return principal


def authenticate_with(uow: UnitOfWork, clock: Clock, secret: str | None) -> Principal:
    from trainhub.service.auth import authenticate

    with uow() as repo:
        return authenticate(repo, secret, clock())
