"""Checkpoints a rank moves to and from the bucket itself, with presigned URLs (ADR 0033).

The control plane still decides everything it decides on the other route: who may save or
restore (the trial's own token), whether the checkpoint fits the quotas (the declared size,
before a byte is sent, and the stored parts' size again before it is published), where it is
stored (the trial's own key: the rank never names a key) and when it becomes visible (the
control plane completes the upload, then registers it in one transaction, as
:meth:`TrackingService.finish_checkpoint` does for a streamed body). Only the bytes skip it.

The route is the server's choice (``--rank-storage``): where it is ``control-plane``, or the
store is a folder, :meth:`DirectCheckpoints.begin_upload` and :meth:`download` answer None and
the rank uses the control plane's route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainhub.core.errors import InvalidRequest
from trainhub.service.ports import (
    ArtifactStore,
    DirectDownload,
    DirectTransfers,
    DirectUpload,
    Principal,
)
from trainhub.service.records import Checkpoint
from trainhub.service.tracking import TrackingService

ROUTES = ("control-plane", "direct")
DEFAULT_ROUTE = "control-plane"  # ADR 0033: the measured reasons
URL_TTL_S = 900  # a URL lives 15 minutes; a rank asks again (the same call) when it expires


@dataclass(frozen=True)
class CheckpointMeta:
    """What a rank says of a checkpoint it saves (as the control plane's route's query)."""

    uuid: str
    step: int
    attempt: int
    metrics: dict[str, Any]
    size: int


class DirectCheckpoints:
    """Presigned checkpoint transfers of ranks, offered when ``route`` is ``direct`` and the
    store can sign URLs."""

    def __init__(
        self,
        tracking: TrackingService,
        store: ArtifactStore,
        route: str = DEFAULT_ROUTE,
        ttl_s: int = URL_TTL_S,
    ) -> None:
        if route not in ROUTES:
            raise ValueError(f"rank storage route must be one of {ROUTES}, got {route!r}")
        self.tracking = tracking
        self.ttl_s = ttl_s
        direct = route == "direct" and hasattr(store, "presign_upload")
        self.store: DirectTransfers | None = store if direct else None  # type: ignore[assignment]

    @property
    def route(self) -> str:
        return "direct" if self.store is not None else "control-plane"

    def begin_upload(
        self, principal: Principal, trial_id: int, meta: CheckpointMeta
    ) -> DirectUpload | Checkpoint | None:
        """Signed part URLs for the checkpoint (asking again refreshes them and lists the
        parts already stored), the checkpoint when this uuid is registered already (a retry),
        or None: use the control plane's route."""
        _check_size(meta.size)
        # the same checks as the control plane's route, whichever route answers
        upload = self.tracking.begin_checkpoint(
            principal, trial_id, meta.uuid, meta.step, meta.attempt, meta.metrics, meta.size
        )
        if isinstance(upload, Checkpoint):
            return upload
        if self.store is None:
            return None
        return self.store.presign_upload(upload.storage_key, meta.size, self.ttl_s)

    def complete_upload(
        self, principal: Principal, trial_id: int, meta: CheckpointMeta, upload_id: str
    ) -> Checkpoint:
        """Publish and register the parts the rank sent (checked against ``meta.size`` and
        the quotas again); the upload is aborted when anything is refused."""
        _check_size(meta.size)
        upload = self.tracking.begin_checkpoint(
            principal, trial_id, meta.uuid, meta.step, meta.attempt, meta.metrics, meta.size
        )
        if isinstance(upload, Checkpoint):
            return upload
        if self.store is None:
            raise InvalidRequest(
                "this server stores checkpoints through the control plane",
                "POST the checkpoint's bytes to /trials/{id}/checkpoints",
            )
        writer = self.store.presigned_writer(upload.storage_key, upload_id, meta.size)
        return self.tracking.finish_checkpoint(principal, upload, writer)

    def download(
        self, principal: Principal, trial_id: int, checkpoint_id: int
    ) -> DirectDownload | None:
        """A GET URL of a checkpoint the trial may read, or None: use the control plane."""
        checkpoint = self.tracking.readable_checkpoint(principal, trial_id, checkpoint_id)
        if self.store is None:
            return None
        return self.store.presign_download(checkpoint.storage_key, self.ttl_s)


def _check_size(size: int) -> None:
    if size < 0:
        raise InvalidRequest("a checkpoint's size must be 0 or more bytes")
