"""Tokens, authentication and the authorisation rules (who may see and touch what).

Tokens are random, shown once and stored only as SHA-256 hashes. A user's token acts with the
user's roles; a trial's token may only report to and read from its own trial.
"""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum

from trainhub.core.errors import NotFound, PermissionDenied, Unauthenticated
from trainhub.service.ports import Principal
from trainhub.service.repository import Repository

TOKEN_PREFIX = "th_"
TOUCH_INTERVAL_S = 60.0  # how stale a token's last_used_at may be


class Role(StrEnum):
    ADMIN = "admin"  # manages the tenant's members; submits
    MEMBER = "member"  # submits and manages its experiments
    VIEWER = "viewer"  # reads only


def new_token() -> tuple[str, str, str]:
    """A fresh token: (the secret to show once, its hash to store, a prefix to list)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, hash_token(secret), secret[:10]


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def authenticate(repo: Repository, secret: str | None, now: float) -> Principal:
    if not secret:
        raise Unauthenticated(
            "no API token was given",
            "send 'Authorization: Bearer <token>'; "
            "the CLI reads TRAINHUB_TOKEN or the login saved by `trainhub login`",
        )
    token = repo.find_token(hash_token(secret))
    if token is None:
        raise Unauthenticated("the API token is not valid", "ask an admin for a new token")
    subject = f"trial-{token.trial_id}" if token.trial_id is not None else f"user-{token.user_id}"
    if token.revoked:
        raise Unauthenticated(
            "the API token is not valid", "ask an admin for a new token", subject=subject
        )
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthenticated("the API token has expired", "create a new one", subject=subject)
    # one write a minute at most: every request authenticates, and a write per request would
    # make a flood of (refused) requests contend for the database with everyone else's
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_INTERVAL_S:
        repo.touch_token(token.id, now)
    if token.trial_id is not None:
        return Principal(None, f"trial-{token.trial_id}", trial_id=token.trial_id)
    assert token.user_id is not None
    user = repo.get_user(token.user_id)
    if user is None or not user.active:
        raise Unauthenticated("the token's user is disabled", "ask an admin", subject=subject)
    return Principal(user.id, user.username, user.is_admin, dict(user.roles))


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise PermissionDenied("only cluster admins may do this")


def require_user(principal: Principal) -> None:
    if principal.trial_id is not None:
        raise PermissionDenied("a trial's token may only report to its own trial")


def visible_tenants(principal: Principal) -> list[str] | None:
    """Tenants whose objects the principal may read; None means all (admins)."""
    if principal.is_admin:
        return None
    return sorted(principal.roles)


def check_read(principal: Principal, tenant: str, what: str) -> None:
    """Another tenant's object is reported as missing, not forbidden: ids leak nothing."""
    if principal.is_admin or tenant in principal.roles:
        return
    raise NotFound(f"{what} does not exist")


def check_write(principal: Principal, tenant: str, what: str) -> None:
    check_read(principal, tenant, what)
    if principal.is_admin:
        return
    if principal.roles.get(tenant) == Role.VIEWER:
        raise PermissionDenied(
            f"viewers of tenant {tenant!r} cannot change {what}",
            "ask a tenant admin for the member role",
        )


def check_trial_scope(principal: Principal, trial_id: int, tenant: str, write: bool) -> None:
    """Trial tokens reach only their trial; users follow tenant roles."""
    if principal.trial_id is not None:
        if principal.trial_id != trial_id:
            raise NotFound(f"trial {trial_id} does not exist")
        return
    if write:
        check_write(principal, tenant, f"trial {trial_id}")
    else:
        check_read(principal, tenant, f"trial {trial_id}")


def choose_tenant(principal: Principal, requested: str | None) -> str:
    """The tenant a submission goes to: the one asked for, or the user's only one."""
    require_user(principal)
    if requested:
        if not principal.is_admin and requested not in principal.roles:
            raise PermissionDenied(
                f"you are not a member of tenant {requested!r}",
                "your tenants: " + (", ".join(sorted(principal.roles)) or "none"),
            )
        return requested
    writable = [t for t, r in principal.roles.items() if r != Role.VIEWER]
    if len(writable) == 1:
        return writable[0]
    if not principal.roles and not principal.is_admin:
        raise PermissionDenied("you are not a member of any tenant", "ask an admin to add you")
    if not writable:
        raise PermissionDenied("viewers cannot submit experiments", "ask for the member role")
    raise PermissionDenied(
        "you belong to several tenants; say which one",
        "pass --tenant NAME (one of: " + ", ".join(sorted(writable)) + ")",
    )
