"""Datasets from the client side: a file or folder as a reproducible tar stream, pushed in
chunks, and the ``/api/v1/datasets`` calls.

The archive is built on the fly (never on disk, never whole in memory) and is the same bytes
for the same content: members sorted by path, owners, times and modes normalised. So its
SHA-256 names the content, and a push of content the tenant stored before uploads nothing
(:func:`push_dataset` asks the server first).

Example::

    from trainhub.client import TrainhubClient
    from trainhub.client.datasets import push_dataset

    with TrainhubClient.from_env() as th:
        version = push_dataset(th, "digits-csv", Path("data/"))
        print(version["ref"], version["stored_bytes"])
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trainhub.client.api import JSON, TrainhubClient
from trainhub.client.errors import ApiError

_BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ArchivePlan:
    """What a push sends: its members, size and hash (measured by a first pass)."""

    root: Path
    members: tuple[tuple[Path, str], ...]  # (path on disk, name in the archive)
    size_bytes: int
    sha256: str
    num_files: int


def _members(path: Path) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, path.name)]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a file nor a folder")
    found: list[tuple[Path, str]] = []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        base = Path(folder)
        for name in sorted(dirs) + sorted(files):
            item = base / name
            if item.is_symlink() or item.is_dir() or item.is_file():
                found.append((item, item.relative_to(path).as_posix()))
    return sorted(found, key=lambda m: m[1])


def _info(path: Path, name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_symlink():
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif path.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = path.stat().st_size
        info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
    return info


def archive_chunks(
    members: tuple[tuple[Path, str], ...] | list[tuple[Path, str]],
) -> Iterator[bytes]:
    """The tar archive of ``members``, in chunks of about 1 MiB (a file that changes size
    while read is cut or padded to the size its header announced)."""
    written = 0
    for path, name in members:
        info = _info(path, name)
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield header
        written += len(header)
        if info.type != tarfile.REGTYPE:
            continue
        left = info.size
        with path.open("rb") as handle:
            while left > 0:
                chunk = handle.read(min(_CHUNK, left)) or b"\0" * min(_CHUNK, left)
                left -= len(chunk)
                written += len(chunk)
                yield chunk
        pad = -info.size % _BLOCK
        if pad:
            yield b"\0" * pad
            written += pad
    end = 2 * _BLOCK
    end += -(written + end) % tarfile.RECORDSIZE
    yield b"\0" * end


def plan_archive(path: Path) -> ArchivePlan:
    """Read ``path`` once to learn the archive's size and SHA-256."""
    members = tuple(_members(path))
    digest = hashlib.sha256()
    size = 0
    for chunk in archive_chunks(members):
        digest.update(chunk)
        size += len(chunk)
    files = sum(1 for p, _ in members if p.is_file() and not p.is_symlink())
    return ArchivePlan(path, members, size, digest.hexdigest(), files)


def push_dataset(
    client: TrainhubClient,
    name: str,
    path: Path,
    tenant: str | None = None,
    progress: Callable[[int], None] | None = None,
    plan: ArchivePlan | None = None,
) -> JSON:
    """Push ``path`` (a file or folder) as the next version of dataset ``name``; answers the
    version with ``stored_bytes`` (0 when the tenant held this content already). ``progress``
    is told the bytes of each chunk sent."""
    plan = plan or plan_archive(path)
    try:
        body: JSON = {"sha256": plan.sha256}
        if tenant:
            body["tenant"] = tenant
        known: JSON = client._json("POST", f"/datasets/{name}/versions", json=body)
        return known
    except ApiError as exc:
        if exc.status_code != 404 or "no dataset content" not in exc.message:
            raise

    def chunks() -> Iterator[bytes]:
        for chunk in archive_chunks(plan.members):
            if progress is not None:
                progress(len(chunk))
            yield chunk

    params: dict[str, Any] = {"sha256": plan.sha256}
    if tenant:
        params["tenant"] = tenant
    result: JSON = client._json(
        "PUT",
        f"/datasets/{name}/archive",
        params=params,
        content=chunks(),
        headers={"Content-Length": str(plan.size_bytes), "Content-Type": "application/x-tar"},
        timeout=httpx.Timeout(client.timeout_s, write=None, read=max(client.timeout_s, 600.0)),
    )
    return result


def list_datasets(client: TrainhubClient, limit: int = 100) -> list[JSON]:
    found: list[JSON] = client._json("GET", "/datasets", params={"limit": limit})["data"]
    return found


def get_dataset(client: TrainhubClient, name: str, tenant: str | None = None) -> JSON:
    params = {"tenant": tenant} if tenant else {}
    found: JSON = client._json("GET", f"/datasets/{name}", params=params)
    return found


def remove_dataset(
    client: TrainhubClient, name: str, version: int | None = None, tenant: str | None = None
) -> list[str]:
    params: dict[str, Any] = {}
    if version is not None:
        params["version"] = version
    if tenant:
        params["tenant"] = tenant
    removed: list[str] = client._json("DELETE", f"/datasets/{name}", params=params)["removed"]
    return removed


def share_dataset(
    client: TrainhubClient, name: str, tenant: str, shared: bool = True, owner: str | None = None
) -> JSON:
    params = {"owner": owner} if owner else {}
    method = "PUT" if shared else "DELETE"
    found: JSON = client._json(method, f"/datasets/{name}/shares/{tenant}", params=params)
    return found
