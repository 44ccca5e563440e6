"""The errors the client raises: the server's answer was an error, or no server answered.

Both carry what the CLI prints (the API's ``code``, ``message`` and ``hint``; the URL tried), so
a caller never has to read an httpx exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class ClientError(Exception):
    """Base of the errors this client raises."""


class ServerUnreachable(ClientError):
    """No trainhub server answered at the URL (refused, DNS failure, timeout).

    Attributes:
        url: the server URL the client tried.
        reason: what went wrong, in words.
        timed_out: the connection or the answer took longer than the client's timeout.
    """

    def __init__(self, url: str, reason: str, timed_out: bool = False) -> None:
        super().__init__(f"cannot reach trainhub at {url}: {reason}")
        self.url = url
        self.reason = reason
        self.timed_out = timed_out


class ApiError(ClientError):
    """The server answered with an error (HTTP 4xx/5xx and a JSON body).

    Attributes:
        status_code: the HTTP status.
        code: the machine-readable error code (``invalid_spec``, ``not_found``, ...).
        message: what was wrong.
        hint: how to fix it ('' when the server gave none).
        errors: per-field problems, each ``{"path", "message", "hint"}`` (e.g. for a bad spec).
    """

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        hint: str = "",
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.hint = hint
        self.errors = list(errors or [])

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "message" not in body:
            text = response.text.strip().replace("\n", " ")[:300]
            return cls(response.status_code, "http_error", f"HTTP {response.status_code}: {text}")
        errors = body.get("errors")
        return cls(
            response.status_code,
            str(body.get("code", "error")),
            str(body["message"]),
            str(body.get("hint") or ""),
            [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else [],
        )


def unreachable_reason(exc: Exception) -> str:
    """What a transport error means, in words (``connection refused`` rather than an errno)."""
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text
