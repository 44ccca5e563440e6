"""A node's cache of dataset versions, by content hash: fetched and extracted once, mounted by
every trial on the node that reads them, bounded, evicted least-recently-used.

Layout under the cache root (``NODE_WORK_DIR/datasets`` by default)::

    entries/<sha256>/       the extracted archive; trials get it read-only (bind mount)
    records/<sha256>.json   what the cache knows of it: size, fetches, hits, last use
    locks/<sha256>.lock     flock: exclusive while it is evicted, shared while a rank uses it
                            (held by the rank's actor, so a crash releases it)
    locks/<sha256>.fetch    flock: exclusive while one rank looks it up, fetches it or counts
                            a hit (never held for longer)
    incoming/               downloads and extractions in progress (renamed into entries/)

The first rank that needs a version fetches it under the fetch lock; others on the node wait for
that lock and find it there (``hits``), copying nothing. Waiting for the use lock exclusively
would wait for every rank that uses the version: two ranks of one trial on one node would wait
for each other (the first in the rendezvous, the second for the first's lock). A version is
published by one rename, so a fetch that dies half-way leaves nothing a later rank would trust.
Past the size cap (``max_bytes``) the least recently used versions that no rank holds are
removed.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

Fetch = Callable[[BinaryIO], None]  # writes the archive's bytes to the open file


class DatasetFetchError(RuntimeError):
    """A version could not be fetched or extracted (the message says which and why)."""


@dataclass
class CacheRecord:
    sha256: str
    archive_bytes: int
    disk_bytes: int
    fetches: int  # times the archive was copied to this node (1 unless it was evicted)
    hits: int  # times a rank found it here and copied nothing
    created_at: float
    last_used: float
    last_ready_s: float  # how long the last rank waited for it (fetch or hit)


@dataclass(frozen=True)
class Acquired:
    """A cached version a rank holds (a shared lock) until :meth:`DatasetCache.release`."""

    sha256: str
    path: Path
    copied_bytes: int
    ready_s: float
    lock_fd: int


def _disk_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


class DatasetCache:
    def __init__(self, root: Path | str, max_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        for sub in ("entries", "records", "locks", "incoming"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def entry(self, sha256: str) -> Path:
        return self.root / "entries" / sha256

    def record(self, sha256: str) -> CacheRecord | None:
        path = self.root / "records" / f"{sha256}.json"
        try:
            return CacheRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _write_record(self, record: CacheRecord) -> None:
        path = self.root / "records" / f"{record.sha256}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(record)))
        os.replace(tmp, path)

    def _lock(self, sha256: str) -> int:
        return os.open(self.root / "locks" / f"{sha256}.lock", os.O_RDWR | os.O_CREAT, 0o600)

    def acquire(self, sha256: str, archive_bytes: int, fetch: Fetch) -> Acquired:
        """The extracted version ``sha256``, fetched first when the node does not hold it; the
        caller holds it (no eviction) until :meth:`release`."""
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise DatasetFetchError(f"not a SHA-256: {sha256!r}")
        start = time.monotonic()
        fd = self._lock(sha256)
        guard = os.open(self.root / "locks" / f"{sha256}.fetch", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)  # one rank looks, fetches and counts at a time
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use from now on: eviction skips it
            entry = self.entry(sha256)
            now = time.time()
            record = self.record(sha256)
            copied = 0
            if entry.is_dir() and record is not None:
                record.hits += 1
            else:
                self.evict(reserve_bytes=archive_bytes)  # make room first (about its size)
                self._fetch(sha256, fetch)
                copied = archive_bytes
                fetches = record.fetches + 1 if record is not None else 1
                record = CacheRecord(
                    sha256, archive_bytes, _disk_bytes(entry), fetches, 0, now, now, 0
                )
            record.last_used = now
            record.last_ready_s = time.monotonic() - start
            self._write_record(record)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.close(guard)
        if copied:
            self.evict()
        return Acquired(sha256, self.entry(sha256), copied, record.last_ready_s, fd)

    def _fetch(self, sha256: str, fetch: Fetch) -> None:
        incoming = self.root / "incoming"
        archive = incoming / f"{sha256}.{os.getpid()}.tar"
        staging = incoming / f"{sha256}.{os.getpid()}.d"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(self.entry(sha256), ignore_errors=True)  # a record-less leftover
        try:
            with archive.open("wb") as handle:
                fetch(handle)
            staging.mkdir()
            try:
                with tarfile.open(archive, mode="r:") as tar:
                    tar.extractall(staging, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise DatasetFetchError(f"the archive does not extract: {exc}") from exc
            os.rename(staging, self.entry(sha256))
        finally:
            archive.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)

    def release(self, held: Acquired) -> None:
        with contextlib.suppress(OSError):
            os.close(held.lock_fd)

    def evict(self, reserve_bytes: int = 0) -> list[str]:
        """Remove least recently used versions no rank holds until the cache fits its cap
        (with ``reserve_bytes`` to spare for a version about to be fetched)."""
        if self.max_bytes is None:
            return []
        gone: list[str] = []
        guard = os.open(self.root / "evict.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            records = [
                r
                for p in (self.root / "records").glob("*.json")
                if (r := self.record(p.stem)) is not None
            ]
            total = sum(r.disk_bytes for r in records)
            for victim in sorted(records, key=lambda r: r.last_used):
                if total + reserve_bytes <= self.max_bytes:
                    break
                fd = self._lock(victim.sha256)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue  # a rank uses it (or it is being fetched)
                try:
                    shutil.rmtree(self.entry(victim.sha256), ignore_errors=True)
                    (self.root / "records" / f"{victim.sha256}.json").unlink(missing_ok=True)
                    total -= victim.disk_bytes
                    gone.append(victim.sha256)
                finally:
                    os.close(fd)
        finally:
            os.close(guard)
        return gone
