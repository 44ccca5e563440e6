"""Checking an uploaded code context: a tar.gz that must be safe to unpack anywhere."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import zlib
from typing import BinaryIO

from trainhub.core.errors import ContextTooLarge, InvalidContext

DEFAULT_MAX_CONTEXT_BYTES = 96 * 1024 * 1024
MAX_CONTEXT_MEMBERS = 100_000


def check_context(data: bytes | BinaryIO, max_bytes: int = DEFAULT_MAX_CONTEXT_BYTES) -> set[str]:
    """Validate a context archive and return the names of its regular files.

    ``data`` is the archive's bytes or a seekable file holding them (read in a stream, left
    at its start). Refused: archives over ``max_bytes`` (compressed or unpacked), member
    names that are absolute or contain '..', links that point outside the archive, devices
    and FIFOs, and archives that are truncated or not tar.gz at all.
    """
    source: BinaryIO = io.BytesIO(data) if isinstance(data, bytes) else data
    size = source.seek(0, os.SEEK_END)
    source.seek(0)
    try:
        return _check(source, size, max_bytes)
    finally:
        source.seek(0)


def _check(source: BinaryIO, size: int, max_bytes: int) -> set[str]:
    if size > max_bytes:
        raise ContextTooLarge(
            f"the code context is {size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.0f} MB",
            "exclude data and outputs with a .trainhubignore file, "
            "or read data from shared storage",
        )
    files: set[str] = set()
    unpacked = 0
    try:
        with tarfile.open(fileobj=source, mode="r:*") as archive:
            for count, member in enumerate(archive, 1):
                if count > MAX_CONTEXT_MEMBERS:
                    raise ContextTooLarge(
                        f"the code context holds more than {MAX_CONTEXT_MEMBERS} files",
                        "exclude data and outputs with a .trainhubignore file",
                    )
                name = member.name
                normalized = posixpath.normpath(name)
                if name.startswith("/") or normalized.startswith("..") or "/../" in f"/{name}/":
                    raise InvalidContext(
                        f"archive member {name!r} points outside the context",
                        "build the archive with relative paths (trainhub submit does this)",
                    )
                if member.issym() or member.islnk():
                    target = member.linkname
                    base = posixpath.dirname(normalized) if member.issym() else ""
                    resolved = posixpath.normpath(posixpath.join(base, target))
                    if target.startswith("/") or resolved.startswith(".."):
                        raise InvalidContext(
                            f"link {name!r} -> {target!r} points outside the context",
                            "remove the link or copy the file it points to",
                        )
                elif not (member.isfile() or member.isdir()):
                    raise InvalidContext(
                        f"archive member {name!r} is not a regular file or directory",
                        "remove devices, FIFOs and sockets from the context",
                    )
                if member.isfile():
                    unpacked += member.size
                    files.add(normalized.removeprefix("./"))
                if unpacked > 4 * max_bytes:
                    raise ContextTooLarge(
                        f"the code context unpacks to more than {4 * max_bytes / 1e6:.0f} MB",
                        "exclude large files from the context",
                    )
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise InvalidContext(
            f"the code context is not a readable tar.gz archive: {exc}",
            "upload a gzip-compressed tar file",
        ) from None
    return files


def read_member(data: bytes | BinaryIO, name: str, max_bytes: int) -> bytes | None:
    """The content of one regular file of a checked archive (None if it holds no such file).

    Reads at most ``max_bytes + 1`` bytes of it, so the caller can refuse a longer file.
    """
    source: BinaryIO = io.BytesIO(data) if isinstance(data, bytes) else data
    source.seek(0)
    try:
        with tarfile.open(fileobj=source, mode="r:*") as archive:
            for member in archive:
                normalized = posixpath.normpath(member.name).removeprefix("./")
                if normalized != name or not member.isfile():
                    continue
                handle = archive.extractfile(member)
                return handle.read(max_bytes + 1) if handle is not None else None
    except (tarfile.TarError, EOFError, zlib.error, OSError):
        return None
    finally:
        source.seek(0)
    return None
