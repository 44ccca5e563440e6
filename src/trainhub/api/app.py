"""The FastAPI application: routes under /api/v1, errors as JSON, an OpenAPI schema."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

import trainhub
from trainhub.api.errors import install_error_handlers
from trainhub.api.routes import admin, experiments, scheduling, search, trials
from trainhub.service.container import Services


def create_app(services: Services) -> FastAPI:
    app = FastAPI(
        title="trainhub",
        version=trainhub.__version__,
        description="Deep-learning training as a service. /api/v1 routes need a bearer token.",
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

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
