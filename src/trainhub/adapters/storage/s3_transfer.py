"""Streaming transfers to and from S3: parallel multipart uploads and parallel ranged reads.

Memory is bounded on both sides: an upload holds at most ``concurrency`` parts in flight plus
the one being filled; a read holds at most ``concurrency`` ranges ahead of its consumer.

A multipart upload is invisible until completed, so a process killed mid-upload leaves
nothing under the key. Its parts stay on the server: a later writer of the same key with
``resume`` finds that upload, and for each part whose size and MD5 (the part's ETag on S3 and
compatible stores) match the bytes it is about to send, sends nothing (:attr:`S3Writer.sent`
counts what it did send). Uploads nobody resumes are removed by the bucket's lifecycle rule
for incomplete multipart uploads (docs/storage.md).
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

PART_BYTES = 8 << 20  # S3 allows 5 MiB..5 GiB a part and 10,000 parts: 80 GB a blob
CONCURRENCY = 4  # more did not upload faster here (ADR 0029) and costs memory


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
        self._pending: list[bytes] = []  # the part being filled, as the caller's chunks
        self._pending_bytes = 0
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

    def write(self, data: bytes) -> None:
        assert self._open, "write after commit or abort"
        self.size += len(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self._part_bytes - self._pending_bytes)
            self._pending.append(bytes(view[:take]))  # a copy: callers may reuse their buffer
            self._pending_bytes += take
            view = view[take:]
            if self._pending_bytes == self._part_bytes:
                self._send(self._take_part())

    def _take_part(self) -> bytes:
        part = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return part

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

    def _send(self, part: bytes) -> None:
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

    def _upload_part(self, number: int, part: bytes) -> str:
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
                if self._pending_bytes or not self._parts:
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
        return self.size

    def abort(self) -> None:
        """Drop what was written (idempotent; a no-op after commit)."""
        if not self._open:
            return
        self._open = False
        self._pending, self._pending_bytes = [], 0
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
    ``range_bytes``, at most ``concurrency`` ranges ahead of the consumer."""

    def fetch(start: int) -> bytes:
        end = min(size, start + range_bytes) - 1
        answer = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")
        return bytes(answer["Body"].read())

    starts = iter(range(0, size, range_bytes))
    with ThreadPoolExecutor(concurrency, thread_name_prefix="s3-range") as pool:
        ahead: deque[Future[bytes]] = deque()
        try:
            for start in starts:
                ahead.append(pool.submit(fetch, start))
                if len(ahead) >= concurrency:
                    break
            while ahead:
                chunk = ahead.popleft().result()
                following = next(starts, None)
                if following is not None:
                    ahead.append(pool.submit(fetch, following))
                for at in range(0, len(chunk), chunk_bytes):
                    yield chunk[at : at + chunk_bytes]
        finally:
            for future in ahead:
                future.cancel()
