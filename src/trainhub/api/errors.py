"""The one place that maps errors to HTTP responses: JSON bodies, never tracebacks."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainhub.core.errors import RateLimited, TrainhubError
from trainhub.core.spec_errors import explain

log = logging.getLogger(__name__)


PageError = Callable[[Request, int, str], Response | None]
"""The dashboard's answer to an error of a page request (an HTML page), or None: not a page."""


def install_error_handlers(app: FastAPI, page_error: PageError | None = None) -> None:
    """JSON for the API; a page of the dashboard's for a browser's request of a dashboard URL
    that the router refused (no such page, a malformed id) when ``page_error`` is given."""

    @app.exception_handler(TrainhubError)
    async def _trainhub_error(_request: Request, exc: TrainhubError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = [
            {
                "path": ".".join(str(p) for p in err["loc"] if p not in ("body", "query", "path")),
                "message": message,
                "hint": hint,
            }
            for err in exc.errors()
            for message, hint in [explain(err, where="the request")]
        ]
        message = "; ".join(f"{e['path']}: {e['message']}" for e in errors)
        page = page_error(request, 422, message) if page_error else None
        if page is not None:
            return page
        return JSONResponse(
            {"code": "invalid_request", "message": message, "errors": errors}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        page = page_error(request, exc.status_code, str(exc.detail)) if page_error else None
        if page is not None:
            return page
        return JSONResponse(
            {"code": "http_error", "message": str(exc.detail)}, status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return JSONResponse(
            {
                "code": "internal_error",
                "message": f"internal error: {type(exc).__name__}",
                "hint": "this is a bug in trainhub; the server log has the details",
            },
            status_code=500,
        )
