"""The FastAPI application: routes under /api/v1, errors as JSON, an OpenAPI schema."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response as StarletteResponse

import trainhub
from trainhub.api.errors import install_error_handlers
from trainhub.api.failed_auth import FailedAuthLimiter, NodeAddresses
from trainhub.api.guard import RequestGuard
from trainhub.api.routes import (
    admin,
    checkpoint_sets,
    datasets,
    debugging,
    environments,
    experiments,
    models,
    monitoring,
    profiles,
    scheduling,
    search,
    sessions,
    trial_storage,
    trials,
)
from trainhub.core import limits
from trainhub.service.container import Services
from trainhub.service.monitoring import MonitoringService
from trainhub.web.routes import mount_ui
from trainhub.web.site import error_page

_CHECKPOINT_UPLOAD = re.compile(r"^/api/v1/trials/[^/]+/checkpoints/?$")
_SET_MEMBER_UPLOAD = re.compile(r"^/api/v1/trials/[^/]+/checkpoints/sets/[^/]+/members/[^/]+/?$")
_DATASET_PUSH = re.compile(r"^/api/v1/datasets/[^/]+/archive/?$")
_TRACE_UPLOAD = re.compile(r"^/api/v1/trials/[^/]+/profiles/[^/]+/ranks/[^/]+/trace/?$")
# multipart framing around the archive and the spec
_FORM_OVERHEAD_BYTES = 1024 * 1024


def body_limit(services: Services, method: str, path: str) -> int | None:
    """The most bytes a request body of this route may declare (None: the route checks)."""
    if method == "POST" and _CHECKPOINT_UPLOAD.match(path):
        return None  # bounded by the tenant's storage quotas, before the body is read
    if method == "PUT" and _SET_MEMBER_UPLOAD.match(path):
        return None  # a sharded checkpoint's file (ADR 0040): bounded as checkpoints are
    if method == "PUT" and _DATASET_PUSH.match(path):
        return None  # bounded by the tenant's storage quota, before the body is read
    if method == "POST" and path.rstrip("/") in ("/api/v1/experiments", "/api/v1/templates"):
        return services.experiments.max_context_bytes + limits.MAX_SPEC_BYTES + _FORM_OVERHEAD_BYTES
    if method == "PUT" and _TRACE_UPLOAD.match(path):
        return limits.MAX_PROFILE_TRACE_BYTES
    if method == "POST" and path.endswith("/metrics"):
        return limits.MAX_METRICS_BODY_BYTES
    return limits.MAX_JSON_BODY_BYTES


def install_latency_middleware(app: FastAPI, monitoring: MonitoringService) -> None:
    """Time every request by its route template (not its path: ids would explode labels)."""

    @app.middleware("http")
    async def time_request(
        request: Request, call_next: Callable[[Request], Awaitable[StarletteResponse]]
    ) -> StarletteResponse:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        if request.url.path.startswith("/api/v1/") and not template.startswith("/api/v1"):
            template = "/api/v1" + template  # routes of the included router lack the prefix
        monitoring.observe_request(request.method, template, time.perf_counter() - started)
        return response


class _Prefixed:
    """Includes routers straight into ``app`` under ``prefix``: FastAPI checks (and so builds)
    every route of a router included without a prefix at once, and a router nested in another
    once more per level (about a second an app; tests build hundreds of apps); one included with
    a prefix is built when first called."""

    def __init__(self, app: FastAPI, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    def include_router(self, router: APIRouter) -> None:
        self.app.include_router(router, prefix=self.prefix)


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
    install_error_handlers(app, page_error=error_page)
    api = _Prefixed(app, "/api/v1")
    api.include_router(experiments.router)
    api.include_router(trials.router)
    api.include_router(trial_storage.router)
    api.include_router(checkpoint_sets.router)
    api.include_router(admin.router)
    api.include_router(scheduling.router)
    api.include_router(search.router)
    api.include_router(debugging.router)
    api.include_router(monitoring.router)
    api.include_router(models.router)
    api.include_router(models.weights_router)
    api.include_router(datasets.router)
    api.include_router(datasets.trial_router)

    api.include_router(profiles.router)
    api.include_router(environments.router)
    api.include_router(sessions.router)
    app.include_router(monitoring.metrics_router)
    if services.monitoring is not None:
        install_latency_middleware(app, services.monitoring)
    mount_ui(app, services)  # the dashboard, /ui (docs/ui.md)
    app.add_middleware(
        RequestGuard,
        authenticate=services.authenticate,
        body_limit=lambda method, path: body_limit(services, method, path),
        limiter=limiter or FailedAuthLimiter(exempt=NodeAddresses(services.node_addresses)),
    )

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
