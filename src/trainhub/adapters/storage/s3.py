"""The artifact store in an S3 bucket (AWS S3 or a compatible server: SeaweedFS, MinIO, Ceph).

``s3://BUCKET/PREFIX``: every key lives under ``PREFIX/`` in ``BUCKET``. Credentials come from
boto3's standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``~/.aws/credentials``, an instance role) and stay in the control plane: ranks reach storage
through its API. Transient failures (throttling, 5xx, a dropped connection, a restarting
server) are retried by botocore with exponential backoff, a bounded number of times, then
raise: a save fails in the script, and nothing is recorded that is not stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from trainhub.adapters.storage.keys import check_key, check_prefix
from trainhub.adapters.storage.s3_transfer import CONCURRENCY, PART_BYTES, S3Writer, iter_ranges
from trainhub.core.errors import NotFound, StorageUnavailable
from trainhub.service.ports import BlobInfo

CHUNK_BYTES = 1 << 20
RANGE_BYTES = 4 << 20  # one ranged GET of a parallel read
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

    def _key(self, key: str) -> str:
        check_key(key)
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
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_file(self, key: str, source: BinaryIO) -> int:
        """Copy an open file into ``key`` in parts; returns the bytes written."""
        writer = self.open_writer(key)
        try:
            while chunk := source.read(CHUNK_BYTES):
                writer.write(chunk)
            return writer.commit()
        finally:
            writer.abort()

    def open_writer(self, key: str, *, resume: bool = True) -> S3Writer:
        """A writer for ``key``: parallel multipart upload, invisible until ``commit``."""
        return S3Writer(
            self.client,
            self.bucket,
            self._key(key),
            part_bytes=self.part_bytes,
            concurrency=self.concurrency,
            resume=resume,
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

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as error:
            if _is_missing(error):
                raise NotFound(f"artifact {key!r} does not exist") from None
            raise
        return bytes(answer["Body"].read())

    def exists(self, key: str) -> bool:
        return self._head(self._key(key)) is not None

    def size(self, key: str) -> int:
        head = self._head(self._key(key))
        return int(head["ContentLength"]) if head else 0

    def write_at(self, key: str, offset: int, data: bytes) -> None:
        # objects are immutable: keep the first ``offset`` bytes and put the whole blob again
        # (logs only: the control loop appends each tick's output)
        kept = self.read_range(key, 0, offset) if offset else b""
        self.put(key, kept + data)

    def read_range(self, key: str, offset: int, length: int | None = None) -> bytes:
        import botocore.exceptions

        if length == 0:
            return b""
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
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> list[BlobInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            for item in page.get("Contents", []):
                found.append(BlobInfo(str(item["Key"])[len(root) :], int(item["Size"])))
        return sorted(found, key=lambda b: b.key)


def make_client(endpoint_url: str | None, *, pool: int = 20) -> Any:
    """A boto3 S3 client with bounded retries and a connection per parallel transfer."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=pool,
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"} if endpoint_url else {},
        # S3-compatible servers differ on the newer default checksums: send and check only
        # what every server answers (MD5 ETags per part stay our resume check)
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
