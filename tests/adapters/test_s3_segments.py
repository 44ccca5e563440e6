"""Logs in a bucket as segment objects (s3_segments.py), against SeaweedFS: an append costs
its own bytes (not a rewrite of the log), small segments are merged into a bounded number, a
fresh process (a restarted control plane) continues or rewrites a log it did not write, and a
log copied from a folder as one object is appended to."""

from __future__ import annotations

import io
from typing import Any

from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.adapters.storage.s3 import S3ArtifactStore
from trainhub.adapters.storage.s3_segments import FAN, TIER_BYTES


class SentBytes:
    """Bytes of every PutObject/UploadPart body the client sends."""

    def __init__(self, client: Any) -> None:
        self.total = 0
        for name in ("PutObject", "UploadPart"):
            client.meta.events.register(f"before-send.s3.{name}", self._count)

    def _count(self, request: Any, **_: Any) -> None:
        body = request.body
        self.total += len(body) if isinstance(body, bytes | bytearray) else 0


def segments_of(store: S3ArtifactStore, key: str) -> list[int]:
    return [s.offset for s in store._segments.listed(key)]


def test_appends_cost_their_own_bytes_and_segments_stay_few(seaweed: SeaweedS3) -> None:
    store = seaweed.store()
    sent = SentBytes(store.client)
    line = b"x" * 99 + b"\n"
    appends = 600
    for i in range(appends):
        store.write_at("logs/rank-0.log", i * len(line), line)
    log_bytes = appends * len(line)
    assert store.get("logs/rank-0.log") == line * appends
    # a rewrite per append would send ~appends/2 times the log (18 MB here); merging the
    # small segments copies each byte once per tier at most
    assert sent.total <= (1 + len(TIER_BYTES)) * log_bytes, sent.total
    assert len(segments_of(store, "logs/rank-0.log")) < 2 * FAN


def test_a_fresh_process_continues_and_rewrites_a_log(seaweed: SeaweedS3) -> None:
    first = seaweed.store()
    first.write_at("logs/r", 0, b"one\n")
    first.write_at("logs/r", 4, b"two\n")
    # the control plane restarted: another store object, no memory of the chain
    again = S3ArtifactStore(first.url, endpoint_url=seaweed.endpoint, client=seaweed.client())
    assert again.size("logs/r") == 8
    again.write_at("logs/r", 8, b"three\n")
    assert again.get("logs/r") == b"one\ntwo\nthree\n"
    again.write_at("logs/r", 2, b"!\n")  # into the first segment: its head is kept
    assert again.get("logs/r") == b"on!\n"
    assert segments_of(again, "logs/r") == [0]
    again.write_at("logs/r", 4, b"four\n")
    assert first.read_range("logs/r", 0) == b"on!\nfour\n"


def test_a_log_stored_as_one_object_is_appended_to(seaweed: SeaweedS3) -> None:
    store = seaweed.store()
    # what `trainhub storage migrate` leaves: the folder's log as one object
    store.put_file("logs/old.log", io.BytesIO(b"from the folder\n"))
    assert store.size("logs/old.log") == 16
    store.write_at("logs/old.log", 16, b"from the bucket\n")
    assert store.get("logs/old.log") == b"from the folder\nfrom the bucket\n"
    assert [b.key for b in store.list("logs/")] == ["logs/old.log"]
    assert store.list("logs/")[0].size == 32
    # segments live beside the store's prefix: its listing never shows them
    root = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + "/")
    assert [o["Key"].removeprefix(store.prefix + "/") for o in root.get("Contents", [])] == []


def test_a_reader_whose_segments_were_merged_meanwhile_reads_the_log_whole(
    seaweed: SeaweedS3,
) -> None:
    store = seaweed.store()
    lines = [f"line {i:02d}\n".encode() for i in range(FAN)]
    for i, line in enumerate(lines[:-1]):
        store.write_at("logs/r", i * 8, line)
    listed = store._segments.chain_of("logs/r")  # a reader lists the chain ...
    assert len(listed) == FAN - 1
    store.write_at("logs/r", (FAN - 1) * 8, lines[-1])  # ... the writer merges them all
    assert segments_of(store, "logs/r") == [0]
    assert b"".join(store._segments.stream("logs/r", 0, None, listed)) == b"".join(lines)
