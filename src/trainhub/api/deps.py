"""FastAPI dependencies as Annotated aliases: who calls, and the services."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainhub.service.container import Services
from trainhub.service.ports import Principal

_bearer = HTTPBearer(auto_error=False, description="An API token (trainhub tokens create)")


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    # the request guard authenticated the caller before the body was read (api/guard.py)
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is not None:
        return principal
    return services.authenticate(credentials.credentials if credentials else None)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
