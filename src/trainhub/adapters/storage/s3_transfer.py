"""Streaming transfers to and from S3: parallel multipart uploads and parallel ranged reads.

Memory is bounded on both sides: an upload holds at most ``concurrency`` parts in flight plus
the one being filled; a read holds at most ``concurrency`` ranges ahead of its consumer.

A multipart upload is invisible until completed, so a process killed mid-upload leaves
nothing under the key. Its parts stay on the server: a later writer of the same key with
``resume`` finds that upload, and for each part whose size and MD5 (the part's ETag on S3 and
compatible stores) match the bytes it is about to send, sends nothing (:attr:`S3Writer.sent`
counts what it did send). Uploads of checkpoints nobody resumes are aborted by the control
loop's sweep once their trial stops writing (ADR 0047); a bucket's lifecycle rule for
incomplete multipart uploads (docs/storage.md) catches the rest.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

PART_BYTES = 8 << 20  # S3 allows 5 MiB..5 GiB a part and 10,000 parts: 80 GB a blob
CONCURRENCY = 4  # more did not upload faster here (ADR 0029) and costs memory
READ_STEP_BYTES = 1 << 20


class S3Writer:
    """A blob being written to ``key``: a multipart upload once it passes one part."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        *,
        part_bytes: int = PART_BYTES,
        concurrency: int = CONCURRENCY,
        resume: bool = True,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        self._part_bytes = part_bytes
        self._resume = resume
        # parts are filled in place: ``concurrency + 1`` buffers of ``part_bytes``, made once
        # and reused (no allocation per part: the process's memory stays flat; ADR 0033)
        self._current: bytearray | None = None  # the part being filled
        self._filled = 0
        self._free: list[bytearray] = []
        self._free_lock = threading.Lock()
        self._upload_id: str | None = None
        self._existing: dict[int, tuple[int, str]] = {}  # part number -> (size, etag)
        self._parts: dict[int, Future[str]] = {}
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._concurrency = concurrency
        self._sent_lock = threading.Lock()
        self._open = True
        self.size = 0  # bytes written by the caller
        self.sent = 0  # bytes actually sent to the server (less when a resume skipped parts)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self._open, "write after commit or abort"
        view = memoryview(data).cast("B")
        self.size += len(view)
        while view:
            room = self._room()
            take = min(len(view), len(room))
            room[:take] = view[:take]  # the one copy: callers may reuse their buffer
            self._wrote(take)
            view = view[take:]

    def write_from(self, source: BinaryIO) -> int:
        """Read ``source`` to its end straight into the part buffers; returns the bytes."""
        assert self._open, "write after commit or abort"
        total = 0
        while got := source.readinto(self._room()):  # type: ignore[attr-defined]
            self.size += got
            total += got
            self._wrote(got)
        return total

    def _room(self) -> memoryview:
        """The free end of the part being filled (a new one when none is)."""
        if self._current is None:
            with self._free_lock:
                buffer = self._free.pop() if self._free else None
            self._current = buffer if buffer is not None else bytearray(self._part_bytes)
            self._filled = 0
        return memoryview(self._current)[self._filled :]

    def _wrote(self, count: int) -> None:
        self._filled += count
        if self._filled == self._part_bytes:
            assert self._current is not None
            part, self._current, self._filled = self._current, None, 0
            self._send(part)

    def _take_part(self) -> bytes:
        """The part being filled, as bytes (the last part, or a blob of one part)."""
        part = bytes(memoryview(self._current)[: self._filled]) if self._current else b""
        self._release(self._current)
        self._current, self._filled = None, 0
        return part

    def _release(self, buffer: bytearray | None) -> None:
        if buffer is not None and len(buffer) == self._part_bytes:
            with self._free_lock:
                self._free.append(buffer)

    def _start(self) -> None:
        if self._resume:
            found = self._client.list_multipart_uploads(Bucket=self._bucket, Prefix=self._key)
            mine = [u for u in found.get("Uploads", []) if u["Key"] == self._key]
            if mine:
                latest = max(mine, key=lambda u: u["Initiated"])
                self._upload_id = str(latest["UploadId"])
                self._existing = self._listed_parts(self._upload_id)
        if self._upload_id is None:
            made = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._key)
            self._upload_id = str(made["UploadId"])
        self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="s3-part")

    def _listed_parts(self, upload_id: str) -> dict[int, tuple[int, str]]:
        parts: dict[int, tuple[int, str]] = {}
        paginator = self._client.get_paginator("list_parts")
        pages = paginator.paginate(Bucket=self._bucket, Key=self._key, UploadId=upload_id)
        for page in pages:
            for part in page.get("Parts", []):
                parts[int(part["PartNumber"])] = (int(part["Size"]), str(part["ETag"]))
        return parts

    def _send(self, part: bytes | bytearray) -> None:
        if self._upload_id is None:
            self._start()
        assert self._pool is not None
        number = len(self._parts) + 1
        self._slots.acquire()  # bounded memory: wait while `concurrency` parts are in flight
        try:
            self._parts[number] = self._pool.submit(self._upload_part, number, part)
        except BaseException:
            self._slots.release()
            raise

    def _upload_part(self, number: int, part: bytes | bytearray) -> str:
        try:
            stored = self._existing.get(number)
            if stored is not None and stored[0] == len(part):
                etag = f'"{hashlib.md5(part, usedforsecurity=False).hexdigest()}"'
                if stored[1] == etag:
                    return etag  # stored by an upload that was killed: not sent again
            answer = self._client.upload_part(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=part,
            )
            with self._sent_lock:
                self.sent += len(part)
            return str(answer["ETag"])
        finally:
            if isinstance(part, bytearray):
                self._release(part)  # the next part is filled into it
            self._slots.release()

    def wait_sent(self) -> int:
        """Wait for the parts in flight (not the one being filled); returns the bytes stored
        in parts so far. A checkpoint of a killed process resumes from there."""
        for future in list(self._parts.values()):
            future.result()
        return len(self._parts) * self._part_bytes

    def commit(self) -> int:
        """Complete the upload (the blob appears whole, at once); returns its size."""
        assert self._open, "commit after commit or abort"
        try:
            if self._upload_id is None:
                # one part or less: a single PUT is as atomic and saves three requests
                data = self._take_part()
                self._client.put_object(Bucket=self._bucket, Key=self._key, Body=data)
                self.sent += len(data)
            else:
                if self._filled or not self._parts:
                    self._send(self._take_part())
                parts = [
                    {"PartNumber": number, "ETag": future.result()}
                    for number, future in sorted(self._parts.items())
                ]
                self._client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                )
        except BaseException:
            self.abort()
            raise
        self._open = False
        self._shutdown()
        self._free.clear()
        return self.size

    def abort(self) -> None:
        """Drop what was written (idempotent; a no-op after commit)."""
        if not self._open:
            return
        self._open = False
        self._current, self._filled = None, 0
        for future in self._parts.values():
            future.cancel()
        self._shutdown()
        if self._upload_id is not None:
            self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id
            )

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def iter_ranges(
    client: Any,
    bucket: str,
    key: str,
    size: int,
    *,
    range_bytes: int,
    chunk_bytes: int,
    concurrency: int = CONCURRENCY,
) -> Iterator[bytes]:
    """The blob's bytes in order in ``chunk_bytes`` pieces, fetched as parallel ranged GETs of
    ``range_bytes``, at most ``concurrency`` ranges ahead of the consumer. Each range is read
    into one of ``concurrency + 1`` buffers made once (the one a consumer reads from is not
    refilled until it moves on), so memory stays flat whatever the size."""
    free: list[bytearray] = []
    lock = threading.Lock()

    def fetch(start: int) -> tuple[bytearray, int]:
        with lock:
            buffer = free.pop() if free else bytearray(range_bytes)
        length = min(size, start + range_bytes) - start
        answer = client.get_object(
            Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
        )
        body, view, got = answer["Body"], memoryview(buffer), 0
        while got < length:
            # a step at a time: urllib3's readinto reads into a temporary object of the
            # size asked for, then copies (a whole range asked at once doubled the memory)
            read = body.readinto(view[got : min(length, got + READ_STEP_BYTES)])
            if not read:
                raise OSError(f"{key}: range at {start} ended after {got} of {length} bytes")
            got += read
        return buffer, length

    starts = iter(range(0, size, range_bytes))
    with ThreadPoolExecutor(concurrency, thread_name_prefix="s3-range") as pool:
        ahead: deque[Future[tuple[bytearray, int]]] = deque()
        try:
            for start in starts:
                ahead.append(pool.submit(fetch, start))
                if len(ahead) >= concurrency:
                    break
            while ahead:
                buffer, length = ahead.popleft().result()
                following = next(starts, None)
                if following is not None:
                    ahead.append(pool.submit(fetch, following))
                view = memoryview(buffer)
                for at in range(0, length, chunk_bytes):
                    yield bytes(view[at : min(length, at + chunk_bytes)])
                with lock:
                    free.append(buffer)
        finally:
            for future in ahead:
                future.cancel()
