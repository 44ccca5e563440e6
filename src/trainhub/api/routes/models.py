"""The model registry: register trials' checkpoints as versioned models, read, download, share."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.model_schemas import (
    ModelPublic,
    ModelRegister,
    ModelsPublic,
    ModelVersionPublic,
    ModelVersionsPublic,
)
from trainhub.api.params import TrialId, errors
from trainhub.api.routes.trial_storage import DirectDownloadPublic, _direct
from trainhub.core import limits
from trainhub.core.errors import NotFound
from trainhub.service.registry import RegistryService

router = APIRouter(prefix="/models", tags=["models"])
weights_router = APIRouter(prefix="/trials", tags=["models"])

ModelName = Annotated[str, Path(min_length=1, max_length=limits.MAX_MODEL_NAME_CHARS)]
VersionNumber = Annotated[int, Path(ge=1, le=1_000_000_000, description="A model version.")]
TenantName = Annotated[str, Path(min_length=1, max_length=64)]
Owner = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        description="The owning tenant, where several visible models share the name.",
    ),
]
_FILE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The weights."}
}


def _registry(services: ServicesDep) -> RegistryService:
    if services.models is None:
        raise NotFound("this server has no model registry")
    return services.models


@router.get("", response_model=ModelsPublic, responses=errors())
def list_models(
    services: ServicesDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_MODELS_LISTED)] = 100,
) -> ModelsPublic:
    """Models of the caller's tenants and those shared with them (admins: all)."""
    found = _registry(services).list_models(principal, limit)
    return ModelsPublic(data=[ModelPublic.of(m) for m in found], count=len(found))


@router.post("", status_code=201, response_model=ModelVersionPublic, responses=errors(404, 409))
def register_model(
    services: ServicesDep, principal: CurrentPrincipal, body: ModelRegister
) -> ModelVersionPublic:
    """A new version of model ``name`` in the trial's tenant, from one of the trial's
    checkpoints (default: its latest); the weights are copied, so checkpoint retention does
    not touch them."""
    version = _registry(services).register(
        principal,
        body.trial_id,
        body.name,
        checkpoint_id=body.checkpoint_id,
        description=body.description,
        arch=body.arch.model_dump(mode="json") if body.arch else None,
        metrics=body.metrics,
        lineage=body.lineage,
    )
    return ModelVersionPublic.of(version)


@router.get("/{model}", response_model=ModelPublic, responses=errors(404))
def get_model(
    services: ServicesDep, principal: CurrentPrincipal, model: ModelName, tenant: Owner = None
) -> ModelPublic:
    return ModelPublic.of(_registry(services).get_model(principal, model, tenant))


@router.get("/{model}/versions", response_model=ModelVersionsPublic, responses=errors(404))
def list_versions(
    services: ServicesDep, principal: CurrentPrincipal, model: ModelName, tenant: Owner = None
) -> ModelVersionsPublic:
    found = _registry(services).get_model(principal, model, tenant)
    data = [ModelVersionPublic.of(v) for v in found.versions]
    return ModelVersionsPublic(data=data, count=len(data))


@router.get("/{model}/versions/{version}", response_model=ModelVersionPublic, responses=errors(404))
def get_version(
    services: ServicesDep,
    principal: CurrentPrincipal,
    model: ModelName,
    version: VersionNumber,
    tenant: Owner = None,
) -> ModelVersionPublic:
    found = _registry(services).get_version(principal, model, version, tenant)
    return ModelVersionPublic.of(found)


@router.delete(
    "/{model}/versions/{version}", response_model=ModelVersionPublic, responses=errors(404, 409)
)
def delete_version(
    services: ServicesDep,
    principal: CurrentPrincipal,
    model: ModelName,
    version: VersionNumber,
    tenant: Owner = None,
) -> ModelVersionPublic:
    """Delete a version and its weights (members of the owning tenant); 409 while an
    unfinished trial starts or distils from it. Its number is never given to another."""
    found = _registry(services).delete_version(principal, model, version, tenant)
    return ModelVersionPublic.of(found)


@router.get(
    "/{model}/versions/{version}/file",
    response_class=Response,
    responses={**_FILE, **errors(404)},
)
def download_version(
    services: ServicesDep,
    principal: CurrentPrincipal,
    model: ModelName,
    version: VersionNumber,
    tenant: Owner = None,
) -> Response:
    """The version's weights (a checkpoint file: ``torch.load`` it), streamed."""
    found, chunks = _registry(services).version_chunks(principal, model, version, tenant)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"Content-Length": str(found.size_bytes)},
    )


@router.put("/{model}/shares/{tenant}", response_model=ModelPublic, responses=errors(404))
def share_model(
    services: ServicesDep,
    principal: CurrentPrincipal,
    model: ModelName,
    tenant: TenantName,
    owner: Owner = None,
) -> ModelPublic:
    """Let tenant ``tenant`` read the model and start from it (admins of its tenant)."""
    return ModelPublic.of(_registry(services).share(principal, model, tenant, True, owner))


@router.delete("/{model}/shares/{tenant}", response_model=ModelPublic, responses=errors(404))
def unshare_model(
    services: ServicesDep,
    principal: CurrentPrincipal,
    model: ModelName,
    tenant: TenantName,
    owner: Owner = None,
) -> ModelPublic:
    """Stop sharing; trials of ``tenant`` that start later cannot load it."""
    return ModelPublic.of(_registry(services).share(principal, model, tenant, False, owner))


@weights_router.get(
    "/{trial_id}/init-weights", response_class=Response, responses={**_FILE, **errors(404)}
)
def init_weights(services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId) -> Response:
    """The weights the trial starts from (its spec's ``model.init_from``), for its runtime."""
    size, chunks = _registry(services).init_weights(principal, trial_id)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size)},
    )


@weights_router.get(
    "/{trial_id}/teacher-weights", response_class=Response, responses={**_FILE, **errors(404)}
)
def teacher_weights(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> Response:
    """The weights of the teacher the trial's spec distils from (``distill.teacher``)."""
    size, chunks = _registry(services).teacher_weights(principal, trial_id)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size)},
    )


def _direct_weights(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: int, field_path: str
) -> DirectDownloadPublic:
    found = _registry(services).trial_weights_source(principal, trial_id, field_path)
    direct = _direct(services).store
    if direct is None:
        return DirectDownloadPublic(route="control-plane")
    url = direct.presign_download(found.storage_key, _direct(services).ttl_s)
    return DirectDownloadPublic(
        route="direct", url=url.url, size_bytes=url.size, expires_in_s=url.expires_s
    )


@weights_router.get(
    "/{trial_id}/init-weights/direct", response_model=DirectDownloadPublic, responses=errors(404)
)
def init_weights_direct(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> DirectDownloadPublic:
    """A presigned GET URL of the trial's starting weights (``--rank-storage direct`` on a
    bucket), or ``route: control-plane`` (GET ``.../init-weights``)."""
    return _direct_weights(services, principal, trial_id, "model.init_from")


@weights_router.get(
    "/{trial_id}/teacher-weights/direct",
    response_model=DirectDownloadPublic,
    responses=errors(404),
)
def teacher_weights_direct(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> DirectDownloadPublic:
    """A presigned GET URL of the teacher's weights, or ``route: control-plane``."""
    return _direct_weights(services, principal, trial_id, "distill.teacher")
