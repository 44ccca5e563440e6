"""The artifact store on a local or shared file system (one root directory).

Keys are relative '/'-separated paths; a key that would leave the root is refused. Writes go
through a temporary file and an atomic rename so a crash never leaves a half-written blob.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainhub.core.errors import InvalidRequest, NotFound


class LocalArtifactStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
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

    def local_path(self, key: str) -> Path:
        """The file behind a key (for streaming responses)."""
        return self._path(key)
