"""Appendable blobs (rank logs) in a bucket: numbered segment objects, so an append costs its
own bytes instead of a rewrite of the whole log.

Objects cannot be appended to. A blob written with ``write_at`` is kept as segments: the
object ``SEGMENTS/KEY/OFFSET`` (OFFSET: 20 digits, the segment's first byte in the blob) holds
the bytes from OFFSET on. The blob is the chain that starts at segment 0 and goes on at each
segment's end; objects off the chain (left by a process killed mid-change) are ignored and
removed by the next writer. ``SEGMENTS`` is a tree beside the store's prefix
(``PREFIX.segments/``), so listings of the store never see a segment.

- An append (``write_at`` at the blob's end) is one PUT of its bytes. The writer (the control
  loop, the one writer of a log) keeps the chain of the blobs it writes in memory; a fresh
  process lists it once.
- Small segments are merged, size-tiered: when the last ``FAN`` segments are of one tier
  (below 16 KiB, 256 KiB, 4 MiB), they are read back and written as one, so a log has at most
  about ``3 * FAN`` small segments plus its 4 MiB ones, and a byte is copied about once per
  tier (at most 3 times) however small the appends were.
- A write before the end (a repeated append after a restart) removes the segments after it,
  last first (the chain stays a prefix of the blob), then writes its segment.
- A whole-blob ``put`` of the same key removes its segments first; a plain object of a key
  with no segment 0 is the blob (a log copied from a folder, ``trainhub storage migrate``):
  the first append turns it into segment 0 by a server-side copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

FAN = 16
TIER_BYTES = (16 << 10, 256 << 10, 4 << 20)  # below each: a tier that merges; above: kept
_DIGITS = 20


@dataclass(frozen=True)
class Segment:
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def _tier(size: int) -> int:
    for tier, limit in enumerate(TIER_BYTES):
        if size < limit:
            return tier
    return len(TIER_BYTES)


def chain(segments: list[Segment]) -> list[Segment]:
    """The segments that make the blob: from offset 0, each starting where the last ended."""
    by_offset = {s.offset: s for s in segments}
    found: list[Segment] = []
    at = 0
    while at in by_offset:
        segment = by_offset[at]
        found.append(segment)
        if segment.size == 0:
            break
        at = segment.end
    return found


class SegmentedBlobs:
    """The segments of appendable blobs under ``root`` (``PREFIX.segments/``) in ``bucket``."""

    def __init__(self, client: Any, bucket: str, root: str) -> None:
        self._client = client
        self._bucket = bucket
        self.root = root
        self._known: dict[str, list[Segment]] = {}  # the chains this process writes
        self._lock = threading.Lock()

    def _name(self, key: str, offset: int) -> str:
        return f"{self.root}/{key}/{offset:0{_DIGITS}d}"

    def listed(self, key: str) -> list[Segment]:
        """Every segment object of ``key`` (on the chain or not), by offset."""
        folder = f"{self.root}/{key}/"
        found = []
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self._bucket, Prefix=folder):
            for item in page.get("Contents", []):
                name = str(item["Key"])[len(folder) :]
                if len(name) == _DIGITS and name.isdigit():
                    found.append(Segment(int(name), int(item["Size"])))
        return sorted(found, key=lambda s: s.offset)

    def sizes(self, prefix: str) -> dict[str, int]:
        """Key -> size of every segmented blob whose key starts with ``prefix``."""
        segments: dict[str, list[Segment]] = {}
        paginator = self._client.get_paginator("list_objects_v2")
        start = f"{self.root}/"
        for page in paginator.paginate(Bucket=self._bucket, Prefix=start + prefix):
            for item in page.get("Contents", []):
                key, _, name = str(item["Key"])[len(start) :].rpartition("/")
                if key and len(name) == _DIGITS and name.isdigit():
                    segments.setdefault(key, []).append(Segment(int(name), int(item["Size"])))
        return {k: c[-1].end for k, found in segments.items() if (c := chain(found))}

    def chain_of(self, key: str) -> list[Segment]:
        """The blob's segments (empty: ``key`` is not segmented)."""
        return chain(self.listed(key))

    def read(self, key: str, segments: list[Segment], offset: int, end: int) -> Iterator[bytes]:
        """Bytes ``offset..end`` of the blob whose chain is ``segments``."""
        for segment in segments:
            if segment.end <= offset or segment.offset >= end or segment.size == 0:
                continue
            first = max(offset, segment.offset) - segment.offset
            last = min(end, segment.end) - segment.offset - 1
            answer = self._client.get_object(
                Bucket=self._bucket,
                Key=self._name(key, segment.offset),
                Range=f"bytes={first}-{last}",
            )
            yield bytes(answer["Body"].read())

    def stream(
        self, key: str, offset: int, end: int | None, segments: list[Segment]
    ) -> Iterator[bytes]:
        """Bytes ``offset..end`` (None: to the blob's end) of a segmented blob whose chain was
        listed as ``segments``. A segment merged away meanwhile (the writer deletes them after
        writing the merged one, which holds the same bytes) makes it list the chain again."""
        at = offset
        for attempt in range(3):
            stop = segments[-1].end if segments else 0
            stop = stop if end is None else min(end, stop)
            try:
                for piece in self.read(key, segments, at, stop):
                    yield piece
                    at += len(piece)
                return
            except Exception as error:  # botocore's ClientError, without importing it here
                code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
                if str(code) not in ("NoSuchKey", "404") or attempt == 2:
                    raise
            segments = self.chain_of(key)

    def _put(self, key: str, offset: int, data: bytes) -> Segment:
        self._client.put_object(Bucket=self._bucket, Key=self._name(key, offset), Body=data)
        return Segment(offset, len(data))

    def _delete(self, key: str, segments: list[Segment]) -> None:
        for segment in sorted(segments, key=lambda s: -s.offset):  # last first
            self._client.delete_object(Bucket=self._bucket, Key=self._name(key, segment.offset))

    def write_at(
        self,
        key: str,
        offset: int,
        data: bytes,
        base: Callable[[], bytes | None],
        drop_base: Callable[[], None],
    ) -> None:
        """Write ``data`` at ``offset`` of the blob, dropping what followed. ``base()``
        returns the bytes of a plain object under the key (a blob never appended to), or
        None; ``drop_base()`` removes it once it is segment 0."""
        with self._lock:
            known = self._known.get(key)
            if known is not None and (known[-1].end if known else 0) == offset and data:
                if known and known[-1].size == 0:
                    known = known[:-1]  # an empty blob: its empty segment 0 is replaced
                known.append(self._put(key, offset, data))
                self._known[key] = self._merged(key, known)
                return
            self._known[key] = self._slow_write(key, offset, data, base, drop_base)

    def _slow_write(
        self,
        key: str,
        offset: int,
        data: bytes,
        base: Callable[[], bytes | None],
        drop_base: Callable[[], None],
    ) -> list[Segment]:
        listed = self.listed(key)
        current = chain(listed)
        if not current:
            plain = base()
            if plain is not None:
                current = listed = [self._put(key, 0, plain)]
                drop_base()
        end = current[-1].end if current else 0
        if offset > end:  # as a file: the gap reads as zeros
            data = bytes(offset - end) + data
            offset = end
        kept = [s for s in current if s.end <= offset]
        start = kept[-1].end if kept else 0
        if start < offset:  # a segment spans the offset: keep its head
            spanning = next(s for s in current if s.offset == start)
            head = b"".join(self.read(key, [spanning], start, offset))
            data, offset = head + data, start
        self._delete(key, [s for s in listed if s.offset > offset])
        if data or offset == 0:
            kept.append(self._put(key, offset, data))
        return self._merged(key, kept)

    def _merged(self, key: str, segments: list[Segment]) -> list[Segment]:
        """Merge the last ``FAN`` segments while they are of one mergeable tier."""
        while len(segments) >= FAN:
            tail = segments[-FAN:]
            tier = _tier(tail[-1].size)
            if tier >= len(TIER_BYTES) or any(_tier(s.size) != tier for s in tail):
                break
            data = b"".join(self.read(key, tail, tail[0].offset, tail[-1].end))
            merged = self._put(key, tail[0].offset, data)  # the chain now skips the rest
            self._delete(key, tail[1:])
            segments = [*segments[:-FAN], merged]
        return segments

    def drop(self, key: str) -> None:
        """Remove every segment of ``key`` (before a whole-blob put or a delete)."""
        with self._lock:
            self._known.pop(key, None)
            listed = self.listed(key)
            if listed:
                self._delete(key, listed)
