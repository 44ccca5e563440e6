"""The one place that maps errors to HTTP responses: JSON bodies, never tracebacks."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainhub.core.errors import TrainhubError
from trainhub.core.spec_errors import explain

log = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TrainhubError)
    async def _trainhub_error(_request: Request, exc: TrainhubError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
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
        return JSONResponse(
            {"code": "invalid_request", "message": message, "errors": errors}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
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
