"""Artifact stores: the backends of :class:`~trainhub.service.ports.ArtifactStore`.

A folder (:class:`LocalArtifactStore`, the embedded default, or a folder every node mounts) or
an S3-compatible bucket (:class:`~trainhub.adapters.storage.s3.S3ArtifactStore`, imported
lazily: boto3 loads only when a server stores in a bucket). :func:`open_artifact_store` picks
one from ``--storage``.
"""

from __future__ import annotations

from trainhub.adapters.storage.factory import open_artifact_store
from trainhub.adapters.storage.local import CHUNK_BYTES, LocalArtifactStore

__all__ = ["CHUNK_BYTES", "LocalArtifactStore", "open_artifact_store"]
