"""The artifact store on a local or shared file system (one root directory).

Keys are relative '/'-separated paths; a key that would leave the root is refused. Writes go
through a temporary file and an atomic rename so a crash never leaves a half-written blob.
Large blobs move in chunks (:meth:`LocalArtifactStore.open_writer`,
:meth:`LocalArtifactStore.iter_chunks`): memory stays flat whatever their size.
"""

from __future__ import annotations

import builtins
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trainhub.adapters.storage.keys import check_key, check_prefix
from trainhub.core.errors import InvalidRequest, NotFound
from trainhub.service.ports import BlobInfo, UnfinishedUpload

CHUNK_BYTES = 1 << 20


class _FileWriter:
    """A blob being written: bytes go to a temporary file beside the key's path."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        self._path = path
        self._tmp = Path(tmp)
        self._handle: BinaryIO | None = os.fdopen(fd, "wb")
        self.size = 0

    def write(self, data: bytes) -> None:
        assert self._handle is not None, "write after commit or abort"
        self._handle.write(data)
        self.size += len(data)

    def commit(self) -> int:
        """Make the blob visible under its key (atomic); returns its size."""
        assert self._handle is not None, "commit after commit or abort"
        handle, self._handle = self._handle, None
        try:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.replace(self._tmp, self._path)
        except BaseException:
            handle.close()
            self._tmp.unlink(missing_ok=True)
            raise
        return self.size

    def abort(self) -> None:
        """Drop what was written (idempotent; a no-op after commit)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self._tmp.unlink(missing_ok=True)


class LocalArtifactStore:
    """:class:`~trainhub.service.ports.ArtifactStore` on a folder (local or shared by nodes)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / check_key(key)).resolve()
        if path == self.root or self.root not in path.parents:
            raise InvalidRequest(f"artifact key {key!r} leaves the artifact store")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_file(self, key: str, source: BinaryIO) -> int:
        """Copy an open file into ``key`` in chunks; returns the bytes written."""
        writer = self.open_writer(key)
        try:
            shutil.copyfileobj(source, writer, CHUNK_BYTES)
            return writer.commit()
        finally:
            writer.abort()

    def open_writer(self, key: str) -> _FileWriter:
        """A writer for ``key``: ``write`` chunks, then ``commit`` (or ``abort``)."""
        return _FileWriter(self._path(key))

    def iter_chunks(self, key: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The blob's bytes in chunks (raises NotFound before the first chunk)."""
        path = self._path(key)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise NotFound(f"artifact {key!r} does not exist") from None

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(chunk_bytes):
                    yield chunk

        return chunks()

    def get(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise NotFound(f"artifact {key!r} does not exist")
        return path.read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else 0

    def write_at(self, key: str, offset: int, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if path.exists() else "wb") as handle:
            handle.truncate(offset)
            handle.seek(offset)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def read_range(self, key: str, offset: int, length: int | None = None) -> bytes:
        path = self._path(key)
        if not path.is_file():
            return b""
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read() if length is None else handle.read(length)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[BlobInfo]:
        # writers' temporary files (".tmp-*") are not blobs: invisible until committed
        check_prefix(prefix)
        found = []
        # walk only the folder the prefix names, not the whole store
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append(BlobInfo(key, path.stat().st_size))
        return sorted(found, key=lambda b: b.key)

    def list_unfinished(self, prefix: str) -> builtins.list[UnfinishedUpload]:
        """Writers' temporary files under ``prefix`` (a process killed mid-write left them):
        the key is the file's own (``folder/.tmp-XXXX``), its start the file's mtime."""
        check_prefix(prefix)
        found = []
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if not name.startswith(".tmp-"):
                    continue
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        started = path.stat().st_mtime
                    except FileNotFoundError:
                        continue  # committed or aborted since the walk saw it
                    found.append(UnfinishedUpload(key, name, started))
        return sorted(found, key=lambda u: u.key)

    def abort_unfinished(self, upload: UnfinishedUpload) -> None:
        path = self._path(upload.key)
        if not path.name.startswith(".tmp-"):
            raise InvalidRequest(f"{upload.key!r} is a blob, not an unfinished write")
        path.unlink(missing_ok=True)

    def local_path(self, key: str) -> Path:
        """The file behind a key (for streaming responses)."""
        return self._path(key)
