"""What every /api/v1 request passes before its body is read: size bounds, authentication,
and the rate limit on failed authentication (api/failed_auth.py).

FastAPI reads (and parses) a request's body before it runs the route's dependencies, so a
300 MiB upload without a valid token used to be parsed whole before its 401. This ASGI
middleware answers from the headers alone: a declared body over its bound gets 413, a missing
or wrong token 401 (429 where its address, token or principal failed too often; a valid
token always passes), all before a byte of the body is read. The principal it found travels
in the request's state to the routes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trainhub.api.failed_auth import FailedAuthLimiter, describe
from trainhub.core.errors import TrainhubError, Unauthenticated
from trainhub.service.ports import Principal

API_PREFIX = "/api/v1/"
_PUBLIC = frozenset({"/api/v1/openapi.json", "/api/v1/docs", "/api/v1/docs/oauth2-redirect"})
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})

__all__ = ["API_PREFIX", "FailedAuthLimiter", "RequestGuard"]


def _error(status: int, code: str, message: str, hint: str, **headers: str) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if hint:
        body["hint"] = hint
    return JSONResponse(body, status_code=status, headers=headers or None)


class RequestGuard:
    """ASGI middleware: body bounds from the headers, then authentication, then the app."""

    def __init__(
        self,
        app: ASGIApp,
        authenticate: Callable[[str | None], Principal],
        body_limit: Callable[[str, str], int | None],
        limiter: FailedAuthLimiter,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.body_limit = body_limit
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(API_PREFIX) or path in _PUBLIC:
            await self.app(scope, receive, send)
            return
        response = await self._check(scope)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method: str = scope["method"]
        if method in _WITH_BODY:
            refused = self._check_length(method, scope["path"], headers)
            if refused is not None:
                return refused
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        authorization = headers.get("authorization", "")
        scheme, _, secret = authorization.partition(" ")
        token = secret.strip() if scheme.lower() == "bearer" else ""
        # the token first: a valid one is never refused by the failure limit (failed_auth.py)
        try:
            principal = await anyio.to_thread.run_sync(self.authenticate, token or None)
        except Unauthenticated as exc:
            if token:
                keys = self.limiter.keys(address, token, exc.subject)
                limited = self.limiter.refusal(keys)
                self.limiter.record(keys)
                if limited is not None:
                    key, wait_s = limited
                    return _error(
                        429,
                        "rate_limited",
                        f"too many failed authentications from {describe(key)}: at most "
                        f"{self.limiter.max_failures} per {self.limiter.window_s:g} s",
                        f"try again in {wait_s:.0f} s with a valid token",
                        **{"Retry-After": str(max(1, round(wait_s)))},
                    )
            return _error(401, exc.code, exc.message, exc.hint, **{"WWW-Authenticate": "Bearer"})
        except TrainhubError as exc:
            return _error(exc.status_code, exc.code, exc.message, exc.hint)
        scope.setdefault("state", {})["principal"] = principal
        return None

    def _check_length(self, method: str, path: str, headers: dict[str, str]) -> JSONResponse | None:
        limit = self.body_limit(method, path)
        if limit is None:
            return None  # the route bounds its own body (checkpoint uploads: quotas)
        declared = headers.get("content-length")
        if declared is None:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                return _error(
                    411,
                    "length_required",
                    "this route needs a Content-Length header",
                    "send the body with its length",
                )
            return None
        if not declared.isdigit() or len(declared) > 19:
            return _error(400, "invalid_request", "the Content-Length header is not a number", "")
        if int(declared) > limit:
            return _error(
                413,
                "too_large",
                f"the request body is {int(declared)} bytes; this route takes at most {limit}",
                "send less in one request",
            )
        return None
