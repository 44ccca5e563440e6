"""Presigned URLs against a real S3 server (SeaweedFS): what a rank can and cannot do with them.

A URL signed for one trial's checkpoint reaches that key only (another trial's key, the same
URL with its path changed, is refused by the server's signature check), for a short time (an
expired URL is refused), and the parts a rank PUT become visible only when the control plane
completes the upload after checking their sizes.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.core.errors import InvalidRequest, NotFound

KEY_A = "tenants/vision/checkpoints/trial-1/aaaa.ckpt"
KEY_B = "tenants/vision/checkpoints/trial-2/bbbb.ckpt"
MIB = 1 << 20


def put_parts(
    urls: tuple[str, ...], data: bytes, part_bytes: int, numbers: range | None = None
) -> list[str]:
    """PUT parts ``numbers`` (default: one per URL from part 1) of ``data``; their ETags."""
    etags = []
    for number in numbers or range(1, len(urls) + 1):
        url = urls[number - 1]
        part = data[(number - 1) * part_bytes : number * part_bytes]
        answer = httpx.put(url, content=part, timeout=60)
        assert answer.status_code == 200, answer.text
        etags.append(answer.headers["ETag"])
    return etags


def test_parts_put_with_presigned_urls_appear_only_when_completed(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=5 * MIB)
    data = bytes(range(256)) * (11 * MIB // 256) + b"tail"
    upload = store.presign_upload(KEY_A, len(data), expires_s=300)
    assert upload.part_bytes == 5 * MIB
    assert len(upload.urls) == 3
    assert not upload.stored
    assert "X-Amz-Signature=" in upload.urls[0]  # SigV4, as AWS requires
    put_parts(upload.urls, data, upload.part_bytes)
    assert not store.exists(KEY_A), "parts are invisible until the control plane completes"
    writer = store.presigned_writer(KEY_A, upload.upload_id, len(data))
    assert writer.size == len(data)
    assert writer.commit() == len(data)
    assert store.get(KEY_A) == data


def test_a_url_for_one_trials_key_cannot_reach_another_trials_key(seaweed: SeaweedS3) -> None:
    store = seaweed.store()
    store.put(KEY_B, b"trial 2's weights")
    upload = store.presign_upload(KEY_A, 10, expires_s=300)
    # the same signed URL aimed at trial 2's key: the signature covers the key
    aimed = upload.urls[0].replace("trial-1/aaaa", "trial-2/bbbb")
    assert aimed != upload.urls[0]
    answer = httpx.put(aimed, content=b"overwrite!")
    assert answer.status_code == 403, answer.text
    store.put(KEY_A, b"trial 1's own")
    own = store.presign_download(KEY_A, 300)
    assert httpx.get(own.url).content == b"trial 1's own"
    stolen = httpx.get(own.url.replace("trial-1/aaaa", "trial-2/bbbb"))
    assert stolen.status_code == 403
    assert b"trial 2" not in stolen.content
    # a listing of the bucket with the object's signature: refused too
    bucket_url = own.url.split("/tenants/")[0] + "/?" + own.url.split("?", 1)[1]
    assert httpx.get(bucket_url).status_code == 403
    assert store.get(KEY_B) == b"trial 2's weights"


def test_expired_urls_are_refused(seaweed: SeaweedS3) -> None:
    store = seaweed.store()
    store.put(KEY_A, b"weights")
    download = store.presign_download(KEY_A, expires_s=1)
    upload = store.presign_upload(KEY_B, 5, expires_s=1)
    time.sleep(2.5)
    answer = httpx.get(download.url)
    assert answer.status_code == 403
    assert b"weights" not in answer.content
    assert httpx.put(upload.urls[0], content=b"12345").status_code == 403
    with pytest.raises(InvalidRequest, match="misses parts"):
        store.presigned_writer(KEY_B, upload.upload_id, 5)


def test_ranged_reads_through_a_presigned_url(seaweed: SeaweedS3) -> None:
    store = seaweed.store()
    store.put(KEY_A, b"0123456789")
    download = store.presign_download(KEY_A, 60)
    assert download.size == 10
    answer = httpx.get(download.url, headers={"Range": "bytes=3-5"})
    assert answer.status_code == 206
    assert answer.content == b"345"
    with pytest.raises(NotFound):
        store.presign_download(KEY_B, 60)


def test_completion_checks_the_parts_against_the_declared_size(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=5 * MIB)
    data = b"x" * (6 * MIB)
    upload = store.presign_upload(KEY_A, len(data), expires_s=300)
    assert len(upload.urls) == 2
    # only the first part sent: refused by name, nothing visible
    put_parts(upload.urls, data, upload.part_bytes, range(1, 2))
    with pytest.raises(InvalidRequest, match=r"misses parts \[2\]"):
        store.presigned_writer(KEY_A, upload.upload_id, len(data))
    # a last part longer than declared: the sizes do not add up
    assert httpx.put(upload.urls[1], content=b"y" * (2 * MIB)).status_code == 200
    with pytest.raises(InvalidRequest, match="agreed sizes"):
        store.presigned_writer(KEY_A, upload.upload_id, len(data))
    with pytest.raises(InvalidRequest, match="does not exist"):
        store.presigned_writer(KEY_A, "no-such-upload", len(data))
    assert not store.exists(KEY_A)


def test_asking_again_lists_the_parts_stored_and_signs_fresh_urls(seaweed: SeaweedS3) -> None:
    store = seaweed.store(part_bytes=5 * MIB)
    data = b"z" * (12 * MIB)
    first = store.presign_upload(KEY_A, len(data), expires_s=300)
    etags = put_parts(first.urls, data, first.part_bytes, range(1, 3))  # then it was killed
    again = store.presign_upload(KEY_A, len(data), expires_s=300)
    assert again.upload_id == first.upload_id
    assert dict(again.stored) == {1: etags[0], 2: etags[1]}
    put_parts(again.urls, data, again.part_bytes, range(3, 4))
    assert store.presigned_writer(KEY_A, again.upload_id, len(data)).commit() == len(data)
    assert store.get(KEY_A) == data
