"""The stored logs of running ranks: where the control loop is in each rank's output on its
node, and the cap on what it stores of it (core/log_cap.py).

The control loop is the only writer of a rank's log. For each (attempt, rank) it keeps the
bytes stored and the offset read from the node's output; they differ once the log was capped.
A restarted control plane finds both again from the stored log: its size and its marker.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhub.core.log_cap import MAX_MARKER_BYTES, LogCap, find_marker, marker
from trainhub.service.ports import ArtifactStore


@dataclass
class LogPosition:
    stored: int  # bytes of the stored log
    read: int  # bytes of the node's output consumed (stored, or dropped under the cap)
    head_end: int | None = None  # where the head ends (the marker starts) once capped
    marker_end: int | None = None
    dropped: int = 0
    skipped: int = 0  # output skipped unread since the last append (not in the marker yet)


class RankLogs:
    """Stores what each poll brought of one trial's rank logs, under the cap."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def position(self, key: str, cap: LogCap) -> LogPosition:
        """Where a log stands, read from the store (once per attempt per process)."""
        stored = self.store.size(key)
        if stored <= cap.head_bytes:
            return LogPosition(stored, stored)
        found = find_marker(self.store.read_range(key, 0, cap.head_bytes + MAX_MARKER_BYTES))
        if found is None:
            return LogPosition(stored, stored)
        start, end, dropped = found
        return LogPosition(stored, stored - (end - start) + dropped, start, end, dropped)

    def skip_behind(self, position: LogPosition, cap: LogCap, log_size: int | None) -> None:
        """After a poll: skip unread output of a flood (the latest is kept), counted as
        dropped and written into the marker at the next append."""
        skip = cap.behind(position.read, log_size)
        position.read += skip
        position.skipped += skip

    def append(self, key: str, position: LogPosition, cap: LogCap, chunk: bytes) -> None:
        """Store ``chunk`` (the output read at ``position.read``) under the cap."""
        position.read += len(chunk)
        skipped, position.skipped = position.skipped, 0
        if not skipped and cap.fits(position.stored, len(chunk)):
            if chunk:
                self.store.write_at(key, position.stored, chunk)
                position.stored += len(chunk)
            return
        if position.head_end is None:  # first rewrite: the head is what came first
            before = self.store.read_range(key, 0)
            if not skipped:  # one stretch: the head may come from this chunk
                before, chunk = before + chunk, b""
            head_end = min(len(before), cap.head_bytes)
            head, rest = before[:head_end], before[head_end:]
        else:
            head_end = position.head_end
            head = self.store.read_range(key, 0, head_end)
            rest = self.store.read_range(key, position.marker_end or head_end)
        if skipped:
            # the output kept after the marker must be one stretch: the old tail goes too
            skipped += len(rest)
            rest = b""
        data, dropped = cap.rewrite(head, position.dropped + skipped, rest + chunk)
        self.store.put(key, data)
        position.stored = len(data)
        position.head_end = head_end
        position.marker_end = head_end + len(marker(dropped, cap.cap_bytes))
        position.dropped = dropped
