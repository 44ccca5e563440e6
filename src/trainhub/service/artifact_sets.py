"""Sets of blobs published at once: a sharded checkpoint, a dataset version, a model's files.

Members are written first, each whole or absent (any :class:`ArtifactStore` keeps that); the
manifest ``PREFIX/MANIFEST.json`` (every member's name, size and SHA-256) is written last. A
set without its manifest does not exist: it is not listed, read or counted, so a process
killed halfway leaves nothing visible, and a retried publish writes the members again (a
bucket's writer sends only the parts it had not stored). Reading verifies each member's
checksum as it streams, and :func:`verify_set` checks a whole set before a restore trusts it.

    entry = write_member(store, "t/7/ckpt/abc", "rank-0.pt", chunks)
    publish_set(store, "t/7/ckpt/abc", [entry], {"step": 100})
    found = read_set(store, "t/7/ckpt/abc")   # None until published
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainhub.core.errors import CorruptArtifact, InvalidRequest, NotFound
from trainhub.service.ports import ArtifactStore

MANIFEST = "MANIFEST.json"
FORMAT = 1

__all__ = [
    "MANIFEST",
    "ArtifactSet",
    "SetMember",
    "copy_set",
    "delete_set",
    "iter_member",
    "list_sets",
    "publish_set",
    "read_set",
    "verify_set",
    "write_member",
]


@dataclass(frozen=True)
class SetMember:
    name: str  # relative to the set's prefix, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class ArtifactSet:
    prefix: str
    members: tuple[SetMember, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The bytes quotas and retention count: the members' (the manifest is bookkeeping)."""
        return sum(m.size for m in self.members)

    def member(self, name: str) -> SetMember:
        for member in self.members:
            if member.name == name:
                return member
        raise NotFound(f"{self.prefix!r} has no member {name!r}")


def _member_key(prefix: str, name: str) -> str:
    if name == MANIFEST:
        raise InvalidRequest(f"a member may not be named {MANIFEST!r}", "rename the file")
    return f"{prefix.rstrip('/')}/{name}"


def write_member(
    store: ArtifactStore, prefix: str, name: str, chunks: Iterable[bytes]
) -> SetMember:
    """Stream one member into the store, hashing it on the way (memory stays flat)."""
    digest = hashlib.sha256()
    writer = store.open_writer(_member_key(prefix, name))
    try:
        for chunk in chunks:
            digest.update(chunk)
            writer.write(chunk)
        size = writer.commit()
    finally:
        writer.abort()
    return SetMember(name, size, digest.hexdigest())


def publish_set(
    store: ArtifactStore,
    prefix: str,
    members: Iterable[SetMember],
    meta: Mapping[str, Any] | None = None,
) -> ArtifactSet:
    """Make the set visible: check every member is stored with its size, then write the
    manifest (last). Raises NotFound naming a member that is missing or short."""
    chosen = tuple(sorted(members, key=lambda m: m.name))
    stored = {b.key: b.size for b in store.list(prefix.rstrip("/") + "/")}
    for member in chosen:
        size = stored.get(_member_key(prefix, member.name))
        if size != member.size:
            raise NotFound(
                f"member {member.name!r} of {prefix!r} is "
                + ("missing" if size is None else f"{size} bytes, not {member.size}"),
                "write every member before publishing the set",
            )
    body = {
        "format": FORMAT,
        "members": [vars(m) for m in chosen],
        "meta": dict(meta or {}),
    }
    store.put(_manifest_key(prefix), json.dumps(body, sort_keys=True).encode())
    return ArtifactSet(prefix, chosen, dict(meta or {}))


def _manifest_key(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/{MANIFEST}"


def read_set(store: ArtifactStore, prefix: str) -> ArtifactSet | None:
    """The published set under ``prefix``, or None (never published, or being written)."""
    try:
        body = json.loads(store.get(_manifest_key(prefix)))
    except NotFound:
        return None
    members = tuple(SetMember(m["name"], int(m["size"]), m["sha256"]) for m in body["members"])
    return ArtifactSet(prefix, members, body.get("meta", {}))


def list_sets(store: ArtifactStore, prefix: str) -> list[str]:
    """The prefixes of every published set under ``prefix`` (those with a manifest)."""
    suffix = "/" + MANIFEST
    return [b.key[: -len(suffix)] for b in store.list(prefix) if b.key.endswith(suffix)]


def iter_member(
    store: ArtifactStore, found: ArtifactSet, name: str, chunk_bytes: int = 1 << 20
) -> Iterator[bytes]:
    """A member's bytes; raises CorruptArtifact naming it when they do not match the manifest
    (after the last chunk: a consumer must not commit what it read before the end)."""
    member = found.member(name)
    chunks = store.iter_chunks(_member_key(found.prefix, name), chunk_bytes)

    def checked() -> Iterator[bytes]:
        digest = hashlib.sha256()
        size = 0
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            yield chunk
        if size != member.size or digest.hexdigest() != member.sha256:
            raise CorruptArtifact(
                f"{found.prefix}/{name} fails its checksum ({size} bytes read, "
                f"{member.size} recorded)",
                "the object was changed or damaged in storage; restore an earlier one",
            )

    return checked()


def verify_set(store: ArtifactStore, found: ArtifactSet) -> list[str]:
    """The names of members whose stored bytes do not match the manifest (empty: whole)."""
    bad = []
    for member in found.members:
        try:
            for _ in iter_member(store, found, member.name):
                pass
        except (CorruptArtifact, NotFound):
            bad.append(member.name)
    return bad


def delete_set(store: ArtifactStore, prefix: str) -> None:
    """Unpublish (manifest first, so a half-deleted set is never visible), then delete."""
    store.delete(_manifest_key(prefix))
    for blob in store.list(prefix.rstrip("/") + "/"):
        store.delete(blob.key)


def copy_set(store: ArtifactStore, source: str, target: str) -> int:
    """Copy the published set ``source`` to ``target`` (members verified as they stream,
    the manifest last); returns the members' bytes."""
    found = read_set(store, source)
    if found is None:
        raise NotFound(f"no published set at {source!r}")
    members = [
        write_member(store, target, m.name, iter_member(store, found, m.name))
        for m in found.members
    ]
    return publish_set(store, target, members, found.meta).size
