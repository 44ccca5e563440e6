"""Tenant datasets: push (streamed), list, show, remove, share; a trial's node fetches its own."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from trainhub.api.dataset_schemas import (
    DatasetFromContent,
    DatasetPublic,
    DatasetPushed,
    DatasetsPublic,
    DatasetVersionPublic,
    RemovedPublic,
    TrialDatasetPublic,
    TrialDatasetsPublic,
)
from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.core import limits
from trainhub.core.dataset_spec import DATASET_NAME_PATTERN, SHA256_PATTERN
from trainhub.core.errors import InvalidRequest, NotFound, TooLarge
from trainhub.service.datasets import DatasetService

router = APIRouter(prefix="/datasets", tags=["datasets"])
trial_router = APIRouter(prefix="/trials", tags=["datasets"])

DatasetName = Annotated[
    str, Path(min_length=1, max_length=limits.MAX_DATASET_NAME_CHARS, pattern=DATASET_NAME_PATTERN)
]
VersionNumber = Annotated[int, Path(ge=1, le=1_000_000_000, description="A dataset version.")]
TenantName = Annotated[str, Path(min_length=1, max_length=64)]
Owner = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        description="The owning tenant (or, for a push, the tenant it goes to).",
    ),
]
_ARCHIVE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/x-tar": {}}, "description": "The version's tar archive."}
}
_WRITE_BYTES = 4 << 20  # written (and hashed) in a worker thread in pieces of this size


def _datasets(services: ServicesDep) -> DatasetService:
    found = services.datasets
    if found is None:
        raise NotFound("this server keeps no datasets")
    return found


@router.get("", response_model=DatasetsPublic, responses=errors())
def list_datasets(
    services: ServicesDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_DATASETS_LISTED)] = 100,
) -> DatasetsPublic:
    """Datasets of the caller's tenants and those shared with them (admins: all)."""
    found = _datasets(services).list_datasets(principal, limit)
    return DatasetsPublic(data=[DatasetPublic.of(d) for d in found], count=len(found))


@router.put(
    "/{name}/archive",
    status_code=201,
    response_model=DatasetPushed,
    responses=errors(404, 409, 413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def push_dataset(
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: DatasetName,
    sha256: Annotated[str, Query(pattern=SHA256_PATTERN, description="SHA-256 of the body.")],
    tenant: Owner = None,
) -> DatasetPushed:
    """Push a new version of dataset ``name``: a tar archive as the raw body, whose
    Content-Length and SHA-256 are announced. The body streams to storage (hashed on the way)
    under a temporary name and is published, with its version, only once it is whole and its
    hash matches; quotas are checked before any byte is read."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise InvalidRequest("a dataset push needs a Content-Length", "use `trainhub data push`")
    size = int(declared)
    service = _datasets(services)
    plan = await run_in_threadpool(service.begin_push, principal, name, sha256, size, tenant)
    writer = await run_in_threadpool(service.open_writer, plan)
    digest = hashlib.sha256()

    def write(data: bytes) -> None:
        digest.update(data)
        writer.write(data)

    try:
        pending: list[bytes] = []
        pending_bytes = received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > size:
                raise TooLarge(f"the body is longer than its Content-Length of {size} bytes")
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= _WRITE_BYTES:
                await run_in_threadpool(write, b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            await run_in_threadpool(write, b"".join(pending))
    except BaseException:
        await run_in_threadpool(writer.abort)
        raise
    result = await run_in_threadpool(
        service.finish_push, principal, plan, writer, digest.hexdigest()
    )
    return DatasetPushed.of_push(result)


@router.post(
    "/{name}/versions", status_code=201, response_model=DatasetPushed, responses=errors(404)
)
def add_from_content(
    services: ServicesDep, principal: CurrentPrincipal, name: DatasetName, body: DatasetFromContent
) -> DatasetPushed:
    """A new version from content the tenant stored before, named by its SHA-256 (404 when
    it has none: push the archive then). Its latest version when that holds the content."""
    result = _datasets(services).add_known(principal, name, body.sha256, body.tenant)
    return DatasetPushed.of_push(result)


@router.get("/{name}", response_model=DatasetPublic, responses=errors(404))
def get_dataset(
    services: ServicesDep, principal: CurrentPrincipal, name: DatasetName, tenant: Owner = None
) -> DatasetPublic:
    return DatasetPublic.of(_datasets(services).get_dataset(principal, name, tenant))


@router.get(
    "/{name}/versions/{version}", response_model=DatasetVersionPublic, responses=errors(404)
)
def get_version(
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: DatasetName,
    version: VersionNumber,
    tenant: Owner = None,
) -> DatasetVersionPublic:
    found = _datasets(services).get_version(principal, name, version, tenant)
    return DatasetVersionPublic.of(found)


@router.delete("/{name}", response_model=RemovedPublic, responses=errors(404))
def remove_dataset(
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: DatasetName,
    version: Annotated[int | None, Query(ge=1, le=1_000_000_000)] = None,
    tenant: Owner = None,
) -> RemovedPublic:
    """Remove one version, or every version (members of its tenant); content that no version
    refers to any more is deleted. Trials that start later cannot mount it."""
    return RemovedPublic(removed=_datasets(services).remove(principal, name, version, tenant))


@router.put("/{name}/shares/{tenant}", response_model=DatasetPublic, responses=errors(404))
def share_dataset(
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: DatasetName,
    tenant: TenantName,
    owner: Owner = None,
) -> DatasetPublic:
    """Let tenant ``tenant`` read and mount the dataset (admins of its tenant)."""
    return DatasetPublic.of(_datasets(services).share(principal, name, tenant, True, owner))


@router.delete("/{name}/shares/{tenant}", response_model=DatasetPublic, responses=errors(404))
def unshare_dataset(
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: DatasetName,
    tenant: TenantName,
    owner: Owner = None,
) -> DatasetPublic:
    """Stop sharing; trials of ``tenant`` that start later cannot mount it."""
    return DatasetPublic.of(_datasets(services).share(principal, name, tenant, False, owner))


@trial_router.get("/{trial_id}/datasets", response_model=TrialDatasetsPublic, responses=errors(404))
def trial_datasets(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialDatasetsPublic:
    """The dataset versions the trial mounts (its spec's data list, pinned), for its node."""
    found = _datasets(services).trial_datasets(principal, trial_id)
    return TrialDatasetsPublic(data=[TrialDatasetPublic.of(m) for m in found], count=len(found))


@trial_router.get(
    "/{trial_id}/datasets/{index}/archive",
    response_class=Response,
    responses={**_ARCHIVE, **errors(404)},
)
def trial_dataset_archive(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    index: Annotated[int, Path(ge=0, lt=limits.MAX_DATA_MOUNTS)],
) -> Response:
    """The tar archive of entry ``index`` of the trial's data list, streamed."""
    version, chunks = _datasets(services).trial_archive(principal, trial_id, index)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/x-tar",
        headers={"Content-Length": str(version.size_bytes), "X-Content-SHA256": version.sha256},
    )
