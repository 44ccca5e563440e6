"""Sharded checkpoints: one object per rank's file, published by a manifest (ADR 0040).

Every rank of an FSDP trial writes its own shards (``torch.distributed.checkpoint``: rank R's
``__R_0.distcp``; rank 0 also the ``.metadata`` and ``shared.pt``, the state that is not
sharded) and uploads them itself, in parallel with the other ranks: through the control
plane's API, or with presigned URLs where the server lets ranks reach the bucket
(``--rank-storage direct``). Each member is an object of its own under the checkpoint's prefix
(``.../trial-N/UUID.shards/NAME``), whole or absent as every blob is. A rank then reports what
it stored (names, sizes, SHA-256, the world size); the report of the last rank publishes the
set: every member is checked to be stored at its size, the quotas are checked for the sum,
the manifest is written and the checkpoint registered, in one step. Until then nothing is
visible: a rank that dies before its report leaves members no listing, restore or quota sees.

The control plane names every key (a rank gives a member's name, never a key) and checks the
trial's token, its attempt and the quotas before a byte is stored, as for one-file checkpoints.
A restore reads the manifest, then each rank only the members it needs.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainhub.core.errors import InvalidRequest, NotFound
from trainhub.service.artifact_sets import (
    MANIFEST,
    ArtifactSet,
    SetMember,
    iter_member,
    publish_set,
    read_set,
)
from trainhub.service.direct_checkpoints import DirectCheckpoints
from trainhub.service.keys import checkpoint_set_key, is_checkpoint_set
from trainhub.service.ports import BlobWriter, DirectDownload, DirectUpload, Principal
from trainhub.service.records import Checkpoint
from trainhub.service.tracking import CheckpointUpload

REPORTS = ".ranks"  # the ranks' reports, under the set's prefix until it is published
MAX_WORLD_SIZE = 4096
MAX_MEMBERS_PER_RANK = 64
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# one control plane serves the API: the last two reports of a set may arrive together
_PUBLISH_LOCK = threading.Lock()


def check_member_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", "..", MANIFEST, REPORTS):
        raise InvalidRequest(
            f"member name {name!r} is not allowed",
            f"use 1-128 letters, digits, '.', '-' or '_' (not {MANIFEST!r} or {REPORTS!r})",
        )
    return name


@dataclass(frozen=True)
class MemberTarget:
    """Where one member's bytes go: the trial's own key, after every check."""

    upload: CheckpointUpload
    key: str


@dataclass(frozen=True)
class RankReport:
    """What one rank stored of a sharded checkpoint."""

    rank: int
    world_size: int
    step: int
    attempt: int
    metrics: dict[str, Any]
    members: tuple[SetMember, ...]

    def to_json(self) -> bytes:
        body = {
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self.step,
            "attempt": self.attempt,
            "metrics": self.metrics,
            "members": [vars(m) for m in self.members],
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankReport:
        body = json.loads(data)
        members = tuple(
            SetMember(m["name"], int(m["size"]), str(m["sha256"])) for m in body["members"]
        )
        return cls(
            int(body["rank"]),
            int(body["world_size"]),
            int(body["step"]),
            int(body["attempt"]),
            dict(body.get("metrics") or {}),
            members,
        )


@dataclass(frozen=True)
class ReportOutcome:
    """After a rank's report: the checkpoint once every rank reported, and how many did."""

    checkpoint: Checkpoint | None
    ranks_reported: int
    world_size: int


class CheckpointSets:
    """The sharded checkpoints' use cases, on either route (``direct``'s choice of route)."""

    def __init__(self, direct: DirectCheckpoints) -> None:
        self.direct = direct
        self.tracking = direct.tracking
        self.store = direct.tracking.store

    # --- writing ---

    def target(
        self,
        principal: Principal,
        trial_id: int,
        uuid: str,
        name: str,
        step: int,
        attempt: int,
        size: int | None,
    ) -> MemberTarget | Checkpoint:
        """Check a member's upload before a byte is stored (the trial's token and attempt,
        the quotas against ``size``); the registered checkpoint when the set is published
        already (a retry: nothing to store)."""
        check_member_name(name)
        if size is not None and size < 0:
            raise InvalidRequest("a member's size must be 0 or more bytes")
        upload = self.tracking.begin_checkpoint(principal, trial_id, uuid, step, attempt, {}, size)
        if isinstance(upload, Checkpoint):
            return upload
        prefix = checkpoint_set_key(upload.tenant, trial_id, uuid)
        return MemberTarget(upload, f"{prefix}/{name}")

    def open_member_writer(self, target: MemberTarget) -> BlobWriter:
        return self.store.open_writer(target.key)

    def begin_direct_member(self, target: MemberTarget, size: int) -> DirectUpload | None:
        """Presigned part URLs of the member (asking again lists the parts stored), or None
        where ranks use the control plane's route."""
        if self.direct.store is None:
            return None
        return self.direct.store.presign_upload(target.key, size, self.direct.ttl_s)

    def complete_direct_member(self, target: MemberTarget, upload_id: str, size: int) -> int:
        """Complete the member's multipart upload (the parts checked against ``size``)."""
        if self.direct.store is None:
            raise InvalidRequest(
                "this server stores checkpoints through the control plane",
                "PUT the member's bytes to .../members/NAME",
            )
        writer = self.direct.store.presigned_writer(target.key, upload_id, size)
        try:
            return writer.commit()
        except BaseException:
            writer.abort()
            raise

    def report(
        self, principal: Principal, trial_id: int, uuid: str, report: RankReport
    ) -> ReportOutcome:
        """Record what one rank stored; the last rank's report publishes the set."""
        _check_report(report)
        upload = self.tracking.begin_checkpoint(
            principal, trial_id, uuid, report.step, report.attempt, report.metrics, None
        )
        if isinstance(upload, Checkpoint):
            return ReportOutcome(upload, report.world_size, report.world_size)
        prefix = checkpoint_set_key(upload.tenant, trial_id, uuid)
        self.store.put(f"{prefix}/{REPORTS}/{report.rank}.json", report.to_json())
        reports = self._reports(prefix)
        complete = {r.rank for r in reports if r.world_size == report.world_size}
        if complete != set(range(report.world_size)):
            return ReportOutcome(None, len(complete), report.world_size)
        with _PUBLISH_LOCK:
            checkpoint = self._publish(principal, upload, prefix, reports)
        for found in self.store.list(f"{prefix}/{REPORTS}/"):
            self.store.delete(found.key)  # bookkeeping only: the manifest says it all now
        return ReportOutcome(checkpoint, report.world_size, report.world_size)

    def _reports(self, prefix: str) -> list[RankReport]:
        found = []
        for blob in self.store.list(f"{prefix}/{REPORTS}/"):
            try:
                found.append(RankReport.from_json(self.store.get(blob.key)))
            except NotFound:
                continue  # deleted by a publish that just ended
        return found

    def _publish(
        self,
        principal: Principal,
        upload: CheckpointUpload,
        prefix: str,
        reports: Sequence[RankReport],
    ) -> Checkpoint:
        members: dict[str, SetMember] = {}
        for report in reports:
            for member in report.members:
                if member.name in members:
                    raise InvalidRequest(
                        f"two ranks of checkpoint {upload.uuid} stored {member.name!r}",
                        "give every rank's files names of their own",
                    )
                members[member.name] = member
        chief = min(reports, key=lambda r: r.rank)
        meta = {
            "kind": "torch.distributed.checkpoint",
            "world_size": chief.world_size,
            "step": chief.step,
            "ranks": {str(r.rank): sorted(m.name for m in r.members) for r in reports},
        }
        chief_upload = CheckpointUpload(
            upload.trial_id,
            upload.tenant,
            upload.uuid,
            chief.step,
            chief.attempt,
            chief.metrics,
            prefix,
            upload.max_bytes,
        )
        size = sum(m.size for m in members.values())
        return self.tracking.register_checkpoint_set(
            principal,
            chief_upload,
            prefix,
            size,
            lambda: publish_set(self.store, prefix, members.values(), meta),
        )

    # --- reading ---

    def manifest(
        self, principal: Principal, trial_id: int, checkpoint_id: int
    ) -> tuple[Checkpoint, ArtifactSet | None]:
        """The checkpoint and its set (None: a one-file checkpoint)."""
        checkpoint = self.tracking.readable_checkpoint(principal, trial_id, checkpoint_id)
        if not is_checkpoint_set(checkpoint.storage_key):
            return checkpoint, None
        found = read_set(self.store, checkpoint.storage_key)
        if found is None:
            raise NotFound(f"checkpoint {checkpoint_id}'s manifest is not in the store")
        return checkpoint, found

    def _member(
        self, principal: Principal, trial_id: int, checkpoint_id: int, name: str
    ) -> tuple[ArtifactSet, SetMember]:
        _, found = self.manifest(principal, trial_id, checkpoint_id)
        if found is None:
            raise NotFound(
                f"checkpoint {checkpoint_id} is one file, not sharded",
                f"GET /trials/{trial_id}/checkpoints/{checkpoint_id}/file",
            )
        return found, found.member(name)

    def member_chunks(
        self, principal: Principal, trial_id: int, checkpoint_id: int, name: str
    ) -> tuple[SetMember, Iterator[bytes]]:
        """A member's bytes, checked against the manifest's SHA-256 as they stream."""
        found, member = self._member(principal, trial_id, checkpoint_id, name)
        return member, iter_member(self.store, found, name)

    def direct_member(
        self, principal: Principal, trial_id: int, checkpoint_id: int, name: str
    ) -> DirectDownload | None:
        found, member = self._member(principal, trial_id, checkpoint_id, name)
        if self.direct.store is None:
            return None
        return self.direct.store.presign_download(
            f"{found.prefix}/{member.name}", self.direct.ttl_s
        )


def _check_report(report: RankReport) -> None:
    if not 1 <= report.world_size <= MAX_WORLD_SIZE:
        raise InvalidRequest(f"world_size must be 1-{MAX_WORLD_SIZE}")
    if not 0 <= report.rank < report.world_size:
        raise InvalidRequest(f"rank must be 0-{report.world_size - 1}")
    if len(report.members) > MAX_MEMBERS_PER_RANK:
        raise InvalidRequest(f"a rank may store at most {MAX_MEMBERS_PER_RANK} files")
    names = [check_member_name(m.name) for m in report.members]
    if len(set(names)) != len(names):
        raise InvalidRequest("a rank's report names a file twice")
    for member in report.members:
        if member.size < 0 or not re.fullmatch(r"[0-9a-f]{64}", member.sha256):
            raise InvalidRequest(
                f"member {member.name!r}: size must be >= 0 and sha256 64 hex digits"
            )
