"""The one exception tree of trainhub.

Every error a user can cause is a :class:`TrainhubError` with a message that says what was wrong
and a hint that says how to fix it. The API maps each class to one HTTP status in one place
(``trainhub.api.errors``); the CLI prints message and hint without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """One problem in a user's input, located by a dotted path (``resources.workers``)."""

    path: str
    message: str
    hint: str = ""

    def render(self) -> str:
        text = f"{self.path or '<root>'}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


class TrainhubError(Exception):
    """Base of all errors trainhub raises on purpose."""

    status_code: int = 400
    code: str = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        return body


class InvalidRequest(TrainhubError):
    status_code = 400
    code = "invalid_request"


class InvalidSpec(TrainhubError):
    """The experiment spec (or another structured input) failed validation."""

    status_code = 422
    code = "invalid_spec"

    def __init__(self, errors: list[FieldError], message: str = "") -> None:
        self.errors = list(errors)
        summary = message or "; ".join(e.render() for e in self.errors)
        super().__init__(summary, "fix the fields listed in 'errors' and submit again")

    def to_dict(self) -> dict[str, object]:
        body = super().to_dict()
        body["errors"] = [
            {"path": e.path, "message": e.message, "hint": e.hint} for e in self.errors
        ]
        return body


class InvalidContext(TrainhubError):
    """The uploaded code context archive is unsafe or malformed."""

    status_code = 422
    code = "invalid_context"


class ContextTooLarge(TrainhubError):
    status_code = 413
    code = "context_too_large"


class TooLarge(TrainhubError):
    """A request body, upload or value is over a documented bound (trainhub.core.limits)."""

    status_code = 413
    code = "too_large"


class QuotaExceeded(TrainhubError):
    """Storing this would pass a storage quota of the trial or the tenant."""

    status_code = 413
    code = "storage_quota_exceeded"


class RateLimited(TrainhubError):
    """Too many requests: failed authentications, or a trial's metric points (Retry-After)."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, hint: str = "", retry_after_s: float = 60.0) -> None:
        super().__init__(message, hint)
        self.retry_after_s = retry_after_s


class Unauthenticated(TrainhubError):
    status_code = 401
    code = "unauthenticated"

    def __init__(self, message: str, hint: str = "", subject: str | None = None) -> None:
        super().__init__(message, hint)
        # who the token belonged to, when it exists but no longer works (revoked, expired):
        # the failed-authentication limit counts that principal too (api/failed_auth.py)
        self.subject = subject


class PermissionDenied(TrainhubError):
    status_code = 403
    code = "permission_denied"


class NotFound(TrainhubError):
    status_code = 404
    code = "not_found"


class Conflict(TrainhubError):
    status_code = 409
    code = "conflict"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class StorageUnavailable(TrainhubError):
    """The artifact store (a bucket) cannot be reached or refuses the server's credentials."""

    status_code = 503
    code = "storage_unavailable"


class CorruptArtifact(TrainhubError):
    """A stored object does not match the checksum its manifest recorded."""

    status_code = 502
    code = "corrupt_artifact"
