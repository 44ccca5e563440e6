"""One place that turns ``--storage`` into an artifact store."""

from __future__ import annotations

from pathlib import Path

from trainhub.adapters.storage.local import LocalArtifactStore
from trainhub.service.ports import ArtifactStore


def is_bucket(location: str | Path) -> bool:
    """Whether ``--storage`` names a bucket (``s3://...``) rather than a folder."""
    return str(location).startswith("s3://")


def open_artifact_store(
    location: str | Path, *, s3_endpoint: str | None = None, check: bool = True
) -> ArtifactStore:
    """A folder's store, or ``s3://BUCKET/PREFIX``'s (checked reachable unless ``check`` is
    false: StorageUnavailable names the endpoint and what failed)."""
    if not is_bucket(location):
        return LocalArtifactStore(location)
    from trainhub.adapters.storage.s3 import S3ArtifactStore

    store = S3ArtifactStore(str(location), endpoint_url=s3_endpoint)
    if check:
        store.check()
    return store
