"""Copy one artifact store into another and verify every object by checksum.

``trainhub storage migrate --to s3://...`` runs it from a folder to a bucket (docs/storage.md
gives the steps for a running cluster). Each blob streams (memory stays flat), is hashed on the
way, then read back from the target and hashed again; a blob already in the target with the
same size and SHA-256 is not copied again, so an interrupted migration resumes where it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainhub.core.errors import NotFound
from trainhub.service.ports import ArtifactStore, BlobInfo


@dataclass
class MigrationReport:
    copied: int = 0
    skipped: int = 0  # already in the target, same checksum
    bytes_copied: int = 0
    mismatched: list[str] = field(default_factory=list)  # keys that failed verification

    @property
    def ok(self) -> bool:
        return not self.mismatched


def _sha256(chunks: Iterable[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _target_sha256(target: ArtifactStore, key: str) -> str | None:
    try:
        return _sha256(target.iter_chunks(key))[0]
    except NotFound:
        return None


def migrate_store(
    source: ArtifactStore,
    target: ArtifactStore,
    *,
    progress: Callable[[BlobInfo, str], None] | None = None,
) -> MigrationReport:
    """Copy every blob of ``source`` into ``target``, verified; ``progress(blob, what)`` is
    told ``copied``, ``skipped`` or ``mismatch`` for each."""
    report = MigrationReport()
    for blob in source.list(""):
        expected, _ = _sha256(source.iter_chunks(blob.key))
        if target.size(blob.key) == blob.size and _target_sha256(target, blob.key) == expected:
            report.skipped += 1
            if progress:
                progress(blob, "skipped")
            continue
        digest = hashlib.sha256()
        writer = target.open_writer(blob.key)
        try:
            for chunk in source.iter_chunks(blob.key):
                digest.update(chunk)
                writer.write(chunk)
            writer.commit()
        finally:
            writer.abort()
        # the source changed while it was read, or the target stored other bytes
        if digest.hexdigest() != expected or _target_sha256(target, blob.key) != expected:
            report.mismatched.append(blob.key)
            if progress:
                progress(blob, "mismatch")
            continue
        report.copied += 1
        report.bytes_copied += blob.size
        if progress:
            progress(blob, "copied")
    return report
