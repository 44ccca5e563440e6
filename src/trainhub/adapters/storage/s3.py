"""The artifact store in an S3 bucket (AWS S3 or a compatible server: SeaweedFS, MinIO, Ceph).

``s3://BUCKET/PREFIX``: every key lives under ``PREFIX/`` in ``BUCKET``. Credentials come from
boto3's standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``~/.aws/credentials``, an instance role) and stay in the control plane: ranks reach storage
through its API. Transient failures (throttling, 5xx, a dropped connection, a restarting
server) are retried by botocore with exponential backoff, a bounded number of times, then
raise: a save fails in the script, and nothing is recorded that is not stored.

Beside it: ``s3_transfer.py`` (parallel multipart uploads and ranged reads in reused
buffers), ``s3_segments.py`` (appendable blobs, rank logs, as segment objects) and
``s3_presign.py`` (URLs a rank moves a checkpoint with, ``--rank-storage direct``).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any, BinaryIO

from trainhub.adapters.storage import s3_presign
from trainhub.adapters.storage.keys import check_key, check_prefix
from trainhub.adapters.storage.s3_segments import SegmentedBlobs
from trainhub.adapters.storage.s3_transfer import CONCURRENCY, PART_BYTES, S3Writer, iter_ranges
from trainhub.core.errors import InvalidRequest, NotFound, StorageUnavailable
from trainhub.service.ports import BlobInfo, DirectDownload, DirectUpload, UnfinishedUpload

CHUNK_BYTES = 1 << 20
RANGE_BYTES = 8 << 20  # one ranged GET of a parallel read: a part (ADR 0033)
SEGMENTS_AT_ROOT = ".segments"  # where a store without a prefix keeps log segments
MAX_ATTEMPTS = 6  # botocore's "standard" mode: exponential backoff with jitter, up to 20 s


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix``)."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket: use s3://BUCKET[/PREFIX]")
    return bucket, prefix.strip("/")


def _is_missing(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    return str(code) in ("404", "NoSuchKey", "NotFound")


class S3ArtifactStore:
    """:class:`~trainhub.service.ports.ArtifactStore` in ``s3://bucket/prefix``."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        part_bytes: int = PART_BYTES,
        concurrency: int = CONCURRENCY,
        client: Any = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = url
        self.endpoint_url = endpoint_url
        self.part_bytes = part_bytes
        self.concurrency = concurrency
        self.client = client or make_client(endpoint_url, pool=2 * concurrency + 4)
        # appendable blobs (logs) as segments, in a tree beside the prefix (s3_segments.py)
        segments_root = f"{self.prefix}.segments" if self.prefix else SEGMENTS_AT_ROOT
        self._segments = SegmentedBlobs(self.client, self.bucket, segments_root)

    def _key(self, key: str) -> str:
        check_key(key)
        if not self.prefix and key.split("/", 1)[0] == SEGMENTS_AT_ROOT:
            raise InvalidRequest(
                f"artifact key {key!r} is reserved in a store at a bucket's root",
                f"use a key that does not start with {SEGMENTS_AT_ROOT}/",
            )
        return f"{self.prefix}/{key}" if self.prefix else key

    def check(self) -> None:
        """Raise StorageUnavailable, naming the endpoint and what failed, unless the bucket
        answers with our credentials (called once at server start)."""
        import botocore.exceptions

        where = f"{self.url} at {self.endpoint_url or 'AWS'}"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as error:
            code = error.response.get("Error", {}).get("Code", "?")
            what = {"404": "no such bucket", "403": "access denied (check the credentials)"}
            raise StorageUnavailable(
                f"storage {where}: {what.get(str(code), f'error {code}')}",
                "create the bucket and set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE",
            ) from None
        except (botocore.exceptions.BotoCoreError, OSError) as error:
            raise StorageUnavailable(
                f"storage {where}: {error}", "check --s3-endpoint and that the server is up"
            ) from None

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        self._segments.drop(key)  # a whole blob replaces an appended one
        self.client.put_object(Bucket=self.bucket, Key=full, Body=data)

    def put_file(self, key: str, source: BinaryIO) -> int:
        """Copy an open file into ``key`` in parts; returns the bytes written."""
        writer = self.open_writer(key)
        try:
            if hasattr(source, "readinto"):
                writer.write_from(source)  # straight into the part buffers
            else:
                while chunk := source.read(CHUNK_BYTES):
                    writer.write(chunk)
            return writer.commit()
        finally:
            writer.abort()

    def open_writer(self, key: str, *, resume: bool = True) -> S3Writer:
        """A writer for ``key``: parallel multipart upload, invisible until ``commit``."""
        full = self._key(key)
        self._segments.drop(key)
        return S3Writer(
            self.client,
            self.bucket,
            full,
            part_bytes=self.part_bytes,
            concurrency=self.concurrency,
            resume=resume,
        )

    def presign_upload(self, key: str, size: int, expires_s: int) -> DirectUpload:
        """Sign one PUT per part of ``key``'s multipart upload (ranks send them, ADR 0033)."""
        return s3_presign.presign_upload(
            self.client,
            self.bucket,
            self._key(key),
            size,
            part_bytes=self.part_bytes,
            expires_s=expires_s,
        )

    def presigned_writer(self, key: str, upload_id: str, size: int) -> s3_presign.PresignedUpload:
        """The parts a rank sent, checked against ``size``; ``commit`` completes the upload."""
        return s3_presign.PresignedUpload(
            self.client,
            self.bucket,
            self._key(key),
            upload_id,
            size=size,
            part_bytes=self.part_bytes,
        )

    def presign_download(self, key: str, expires_s: int) -> DirectDownload:
        full = self._key(key)
        head = self._head(full)
        if head is None:
            raise NotFound(f"artifact {key!r} does not exist")
        return s3_presign.presign_download(
            self.client, self.bucket, full, int(head["ContentLength"]), expires_s=expires_s
        )

    def _head(self, key: str) -> dict[str, Any] | None:
        import botocore.exceptions

        try:
            answer: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=key)
            return answer
        except botocore.exceptions.ClientError as error:
            if _is_missing(error):
                return None
            raise

    def iter_chunks(self, key: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The blob's bytes in chunks, read in parallel ranges (NotFound before any chunk)."""
        full = self._key(key)
        segments = self._segments.chain_of(key)
        if segments:
            return _rechunk(self._segments.stream(key, 0, None, segments), chunk_bytes)
        head = self._head(full)
        if head is None:
            raise NotFound(f"artifact {key!r} does not exist")
        return iter_ranges(
            self.client,
            self.bucket,
            full,
            int(head["ContentLength"]),
            range_bytes=max(RANGE_BYTES, chunk_bytes),
            chunk_bytes=chunk_bytes,
            concurrency=self.concurrency,
        )

    def get(self, key: str) -> bytes:
        import botocore.exceptions

        segments = self._segments.chain_of(self._checked(key))
        if segments:
            return b"".join(self._segments.stream(key, 0, None, segments))
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as error:
            if _is_missing(error):
                raise NotFound(f"artifact {key!r} does not exist") from None
            raise
        return bytes(answer["Body"].read())

    def exists(self, key: str) -> bool:
        full = self._key(key)
        return bool(self._segments.chain_of(key)) or self._head(full) is not None

    def size(self, key: str) -> int:
        full = self._key(key)
        segments = self._segments.chain_of(key)
        if segments:
            return segments[-1].end
        head = self._head(full)
        return int(head["ContentLength"]) if head else 0

    def write_at(self, key: str, offset: int, data: bytes) -> None:
        """Append (or write at ``offset``, dropping what followed) as a segment object: an
        append costs its own bytes (s3_segments.py)."""
        full = self._key(key)

        def base() -> bytes | None:
            return self.get(key) if self._head(full) is not None else None

        def drop_base() -> None:
            self.client.delete_object(Bucket=self.bucket, Key=full)

        self._segments.write_at(key, offset, data, base, drop_base)

    def read_range(self, key: str, offset: int, length: int | None = None) -> bytes:
        import botocore.exceptions

        if length == 0:
            return b""
        segments = self._segments.chain_of(self._checked(key))
        if segments:
            stop = None if length is None else offset + length
            return b"".join(self._segments.stream(key, offset, stop, segments))
        end = "" if length is None else str(offset + length - 1)
        try:
            answer = self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={offset}-{end}"
            )
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if _is_missing(error) or code in ("InvalidRange", "416"):
                return b""
            raise
        return bytes(answer["Body"].read())

    def delete(self, key: str) -> None:
        full = self._key(key)
        self._segments.drop(key)
        self.client.delete_object(Bucket=self.bucket, Key=full)

    def list(self, prefix: str) -> list[BlobInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            for item in page.get("Contents", []):
                found.append(BlobInfo(str(item["Key"])[len(root) :], int(item["Size"])))
        appended = self._segments.sizes(prefix)  # logs: one blob each, whatever its segments
        found = [b for b in found if b.key not in appended]
        found += [BlobInfo(key, size) for key, size in appended.items()]
        return sorted(found, key=lambda b: b.key)

    def list_unfinished(self, prefix: str) -> builtins.list[UnfinishedUpload]:
        """The bucket's multipart uploads under ``prefix`` never completed nor aborted (a
        writer killed mid-upload, a rank's presigned parts never completed)."""
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            for item in page.get("Uploads", []):
                found.append(
                    UnfinishedUpload(
                        str(item["Key"])[len(root) :],
                        str(item["UploadId"]),
                        item["Initiated"].timestamp(),
                    )
                )
        return sorted(found, key=lambda u: (u.key, u.started_at))

    def abort_unfinished(self, upload: UnfinishedUpload) -> None:
        import botocore.exceptions

        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._key(upload.key), UploadId=upload.upload_id
            )
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code not in ("NoSuchUpload", "404"):
                raise

    def _checked(self, key: str) -> str:
        self._key(key)
        return key


def _rechunk(pieces: Iterator[bytes], chunk_bytes: int) -> Iterator[bytes]:
    for piece in pieces:
        for at in range(0, len(piece), chunk_bytes):
            yield piece[at : at + chunk_bytes]


def make_client(endpoint_url: str | None, *, pool: int = 20) -> Any:
    """A boto3 S3 client with bounded retries and a connection per parallel transfer."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        signature_version="s3v4",
        max_pool_connections=pool,
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"} if endpoint_url else {},
        # presigned URLs (ADR 0033) in SigV4 too: AWS refuses V2 in most regions
        # S3-compatible servers differ on the newer default checksums: send and check only
        # what every server answers (MD5 ETags per part stay our resume check)
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
