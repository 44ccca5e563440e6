"""A rank's checkpoint bytes straight to and from the bucket, with URLs the control plane
signed for this trial and this object (ADR 0033). The rank holds no bucket credentials.

Uploads send the file's parts in parallel (each worker reads its own part from the file, so a
rank holds at most ``CONCURRENCY`` parts), skipping parts an earlier, killed try stored
(their MD5 equals the ETag the control plane listed). Downloads read parallel ranges into
their places in the destination file. Failures map onto the runtime's retry rule
(:mod:`trainhub.runtime.transport`): a dropped connection, a 5xx, or an expired URL is
transient (the retry asks for fresh URLs and sends only the missing parts); any other refusal
is not. No connection to the bucket at all (:class:`BucketUnreachable`) sends the rank back to
the control plane's route.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainhub.runtime.transport import ControlPlaneError, TransientError


class BucketUnreachable(TransientError):
    """No connection to the bucket's endpoint at all (a contained trial's network reaches
    only the control plane, ADR 0027): the control plane's route is used instead."""


CONCURRENCY = 4
RANGE_BYTES = 32 << 20  # one ranged GET of a download (streamed to the file: no memory)
_READ_BYTES = 1 << 20


class _Connections:
    """One kept-alive connection per thread to the bucket's endpoint (the standard library's
    ``http.client``: it reads a body straight into a buffer; these are large transfers)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._netloc = parts.netloc
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @contextmanager
    def connection(self, what: str) -> Iterator[http.client.HTTPConnection]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(self._netloc, timeout=self._timeout_s)
            try:
                conn.connect()
            except OSError as exc:
                message = f"{what}: cannot connect to {self._netloc}: {exc!r}"
                raise BucketUnreachable(message) from exc
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        try:
            yield conn
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._local.conn = None
            raise TransientError(f"{what}: {exc!r}") from exc

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()


def _target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def _refused(status: int, detail: bytes, what: str, issued_at: float, expires_s: float) -> None:
    """Raise for a failed answer of the bucket: transient (retry with fresh URLs) or not."""
    text = detail[:300].decode(errors="replace")
    if status >= 500 or status in (408, 429):
        raise TransientError(f"{what}: HTTP {status} {text}")
    if status == 403 and time.monotonic() - issued_at >= expires_s * 0.9:
        raise TransientError(f"{what}: the presigned URL expired, asking for new ones")
    raise ControlPlaneError(f"{what}: the bucket refused: HTTP {status} {text}", status)


def _part_bytes(path: Path, number: int, part_bytes: int, size: int) -> bytes:
    start = (number - 1) * part_bytes
    length = min(part_bytes, size - start)
    with path.open("rb", buffering=0) as f:
        data = os.pread(f.fileno(), length, start)
    if len(data) != length:
        raise ControlPlaneError(f"the checkpoint file {path} changed while it was uploaded")
    return data


def upload_parts(
    path: Path,
    plan: Mapping[str, Any],
    *,
    issued_at: float,
    timeout_s: float,
    concurrency: int = CONCURRENCY,
) -> int:
    """PUT every part of ``path`` the plan (the control plane's answer) asks for; returns the
    bytes sent (parts already stored are skipped)."""
    size = path.stat().st_size
    part_bytes = int(plan["part_bytes"])
    urls: list[str] = list(plan["urls"])
    stored = {int(k): str(v) for k, v in (plan.get("stored") or {}).items()}
    expires_s = float(plan.get("expires_in_s") or 0)
    if not urls:
        return 0
    connections = _Connections(urls[0], timeout_s)  # no trainhub token goes to the bucket

    def send(number: int) -> int:
        data = _part_bytes(path, number, part_bytes, size)
        if number in stored:
            etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
            if stored[number] == etag:
                return 0  # stored by a try that was killed
        what = f"PUT part {number} of {len(urls)}"
        with connections.connection(what) as conn:
            conn.request("PUT", _target(urls[number - 1]), body=data)
            response = conn.getresponse()
            detail = response.read()
        if response.status >= 300:
            _refused(response.status, detail, what, issued_at, expires_s)
        return len(data)

    try:
        with ThreadPoolExecutor(concurrency, thread_name_prefix="trainhub-put") as pool:
            return sum(pool.map(send, range(1, len(urls) + 1)))
    finally:
        connections.close()


def download_ranges(
    url: str,
    size: int,
    destination: Path,
    *,
    issued_at: float,
    expires_s: float,
    timeout_s: float,
    concurrency: int = CONCURRENCY,
    range_bytes: int = RANGE_BYTES,
) -> None:
    """Fill ``destination`` (created or truncated) with the blob's ``size`` bytes, read as
    parallel ranged GETs, each written at its offset as it streams."""
    connections = _Connections(url, timeout_s)
    target = _target(url)
    local = threading.local()

    def fetch(fd: int, start: int) -> None:
        end = min(size, start + range_bytes) - 1
        what = f"GET bytes {start}-{end}"
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = memoryview(bytearray(_READ_BYTES))
        with connections.connection(what) as conn:
            conn.request("GET", target, headers={"Range": f"bytes={start}-{end}"})
            response = conn.getresponse()
            if response.status >= 300:
                _refused(response.status, response.read(), what, issued_at, expires_s)
            at = start
            while at <= end:
                got = response.readinto(buffer[: min(_READ_BYTES, end + 1 - at)])
                if not got:
                    break
                os.pwrite(fd, buffer[:got], at)
                at += got
            response.read()  # the connection is reused: nothing may be left unread
        if at != end + 1:
            raise TransientError(f"{what}: the bucket sent {at - start} bytes")

    try:
        with destination.open("wb") as out:
            out.truncate(size)
            run: Callable[[int], None] = lambda start: fetch(out.fileno(), start)  # noqa: E731
            with ThreadPoolExecutor(concurrency, thread_name_prefix="trainhub-get") as pool:
                list(pool.map(run, range(0, size, range_bytes)))
    finally:
        connections.close()


def fetch_if_direct(
    api_url: str, token: str | None, direct_path: str, destination: Path, timeout_s: float
) -> bool:
    """Ask the control plane for a presigned URL of an artifact (``direct_path``: a
    ``.../direct`` route) and read it into ``destination``; False where it answers
    ``route: control-plane``, where it has no such route, or where the bucket cannot be
    reached from here: the caller then reads through the control plane."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    issued_at = time.monotonic()
    try:
        response = httpx.get(api_url + direct_path, headers=headers, timeout=timeout_s)
    except httpx.TransportError:
        return False  # the caller's own request says what is wrong
    if response.status_code >= 400:
        return False  # an older server, or a refusal the control plane's route names
    plan = response.json()
    if not isinstance(plan, dict) or plan.get("route") != "direct":
        return False
    try:
        download_ranges(
            str(plan["url"]),
            int(plan["size_bytes"]),
            destination,
            issued_at=issued_at,
            expires_s=float(plan.get("expires_in_s") or 0),
            timeout_s=max(timeout_s, 60.0),
        )
    except BucketUnreachable:
        destination.unlink(missing_ok=True)
        return False
    return True
