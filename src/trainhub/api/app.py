"""The FastAPI application: routes under /api/v1, errors as JSON, an OpenAPI schema."""

from __future__ import annotations

import re

from fastapi import APIRouter, FastAPI

import trainhub
from trainhub.api.errors import install_error_handlers
from trainhub.api.guard import FailedAuthLimiter, RequestGuard
from trainhub.api.routes import admin, experiments, scheduling, search, trials
from trainhub.core import limits
from trainhub.service.container import Services
from trainhub.web.routes import mount_ui

_CHECKPOINT_UPLOAD = re.compile(r"^/api/v1/trials/[^/]+/checkpoints/?$")
# multipart framing around the archive and the spec
_FORM_OVERHEAD_BYTES = 1024 * 1024


def body_limit(services: Services, method: str, path: str) -> int | None:
    """The most bytes a request body of this route may declare (None: the route checks)."""
    if method == "POST" and _CHECKPOINT_UPLOAD.match(path):
        return None  # bounded by the tenant's storage quotas, before the body is read
    if method == "POST" and path.rstrip("/") in ("/api/v1/experiments", "/api/v1/templates"):
        return services.experiments.max_context_bytes + limits.MAX_SPEC_BYTES + _FORM_OVERHEAD_BYTES
    if method == "POST" and path.endswith("/metrics"):
        return limits.MAX_METRICS_BODY_BYTES
    return limits.MAX_JSON_BODY_BYTES


def create_app(services: Services, limiter: FailedAuthLimiter | None = None) -> FastAPI:
    app = FastAPI(
        title="trainhub",
        version=trainhub.__version__,
        description=(
            "Deep-learning training as a service. /api/v1 routes need a bearer token. "
            "Every input has a documented bound (docs/adr/0008-every-input-bounded.md); a "
            "request beyond one is refused with a 4xx JSON body that names it."
        ),
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
    )
    app.state.services = services
    install_error_handlers(app)
    api = APIRouter(prefix="/api/v1")
    api.include_router(experiments.router)
    api.include_router(trials.router)
    api.include_router(admin.router)
    api.include_router(scheduling.router)
    api.include_router(search.router)
    app.include_router(api)
    mount_ui(app, services)  # the dashboard, /ui (docs/ui.md)
    app.add_middleware(
        RequestGuard,
        authenticate=services.authenticate,
        body_limit=lambda method, path: body_limit(services, method, path),
        limiter=limiter or FailedAuthLimiter(),
    )

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
