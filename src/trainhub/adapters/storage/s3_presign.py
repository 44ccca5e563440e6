"""Presigned URLs: a rank moves a checkpoint's bytes to and from the bucket itself.

The control plane keeps the credentials; it signs, per object and for a short time, exactly
the requests a rank may make: ``UploadPart`` of one multipart upload of one key (a checkpoint
the trial is saving) and ``GetObject`` of one key (a checkpoint the trial may restore). A
signature covers the bucket, the key and the query (upload id, part number, expiry), so a URL
for one trial's key cannot reach another key, and an expired one is refused by the server
(tests/adapters/test_s3_presign.py, against SeaweedFS).

The upload is completed by the control plane, not the rank: :class:`PresignedUpload` reads the
parts back from the server (``ListParts``), checks that they are numbered 1..n, that every
part but the last has the agreed size and that the sizes add up to what the rank declared,
and completes the upload with the server's own ETags. Until then nothing is visible; a rank
killed mid-upload leaves parts that its retry (same key) finds and does not send again.
"""

from __future__ import annotations

import math
from typing import Any

from trainhub.core.errors import InvalidRequest
from trainhub.service.ports import DirectDownload, DirectUpload

MAX_PARTS = 10_000  # S3's limit on the parts of one upload
MIN_PART_BYTES = 5 << 20  # S3's smallest part but the last


def part_count(size: int, part_bytes: int) -> int:
    return max(1, math.ceil(size / part_bytes))


def choose_part_bytes(size: int, part_bytes: int) -> int:
    """``part_bytes``, or larger where a huge blob would need more than S3's 10,000 parts."""
    needed = math.ceil(size / MAX_PARTS)
    return max(part_bytes, MIN_PART_BYTES, needed)


def find_upload(client: Any, bucket: str, key: str) -> str | None:
    """The latest unfinished multipart upload of ``key`` (a killed writer's), or None."""
    found = client.list_multipart_uploads(Bucket=bucket, Prefix=key)
    mine = [u for u in found.get("Uploads", []) if u["Key"] == key]
    if not mine:
        return None
    return str(max(mine, key=lambda u: u["Initiated"])["UploadId"])


def stored_parts(client: Any, bucket: str, key: str, upload_id: str) -> dict[int, tuple[int, str]]:
    """Part number -> (size, ETag) of the parts the server holds for an upload."""
    parts: dict[int, tuple[int, str]] = {}
    paginator = client.get_paginator("list_parts")
    for page in paginator.paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        for part in page.get("Parts", []):
            parts[int(part["PartNumber"])] = (int(part["Size"]), str(part["ETag"]))
    return parts


def presign_upload(
    client: Any, bucket: str, key: str, size: int, *, part_bytes: int, expires_s: int
) -> DirectUpload:
    """Open (or find again) the multipart upload of ``key`` and sign one PUT per part."""
    part_bytes = choose_part_bytes(size, part_bytes)
    upload_id = find_upload(client, bucket, key)
    stored: dict[int, tuple[int, str]] = {}
    if upload_id is not None:
        stored = stored_parts(client, bucket, key, upload_id)
    else:
        upload_id = str(client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    urls = [
        client.generate_presigned_url(
            "upload_part",
            Params={"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": number},
            ExpiresIn=expires_s,
        )
        for number in range(1, part_count(size, part_bytes) + 1)
    ]
    return DirectUpload(
        upload_id=upload_id,
        part_bytes=part_bytes,
        urls=tuple(urls),
        stored={number: etag for number, (_size, etag) in stored.items()},
        expires_s=expires_s,
    )


def presign_download(
    client: Any, bucket: str, key: str, size: int, *, expires_s: int
) -> DirectDownload:
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
    )
    return DirectDownload(url=url, size=size, expires_s=expires_s)


class PresignedUpload:
    """A :class:`~trainhub.service.ports.BlobWriter` over parts a rank PUT itself: ``size`` is
    what the server holds (checked against the declared size), ``commit`` completes it."""

    def __init__(
        self, client: Any, bucket: str, key: str, upload_id: str, *, size: int, part_bytes: int
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        self._upload_id = upload_id
        self._open = True
        part_bytes = choose_part_bytes(size, part_bytes)
        try:
            parts = stored_parts(client, bucket, key, upload_id)
        except Exception as error:
            code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
            if code in ("NoSuchUpload", "404"):
                raise InvalidRequest(
                    f"upload {upload_id!r} of this checkpoint does not exist",
                    "start the upload again (POST .../checkpoints/direct)",
                ) from None
            raise
        count = part_count(size, part_bytes)
        missing = [n for n in range(1, count + 1) if n not in parts]
        if missing:
            raise InvalidRequest(
                f"the upload misses parts {missing[:10]} of {count}",
                "PUT every part before completing",
            )
        wrong = [
            n
            for n in range(1, count + 1)
            if parts[n][0] != (part_bytes if n < count else size - part_bytes * (count - 1))
        ]
        if wrong or len(parts) != count:
            raise InvalidRequest(
                f"parts {wrong[:10] or sorted(set(parts) - set(range(1, count + 1)))[:10]} do "
                f"not have the agreed sizes ({part_bytes} bytes but the last, {size} in all)",
                "send each part's bytes exactly as the upload's part_bytes cut them",
            )
        self._parts = [{"PartNumber": n, "ETag": parts[n][1]} for n in range(1, count + 1)]
        self.size = size

    def write(self, data: bytes) -> None:
        raise TypeError("the parts of a presigned upload are written by the rank")

    def commit(self) -> int:
        assert self._open, "commit after commit or abort"
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._open = False
        return self.size

    def abort(self) -> None:
        if not self._open:
            return
        self._open = False
        self._client.abort_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id
        )
