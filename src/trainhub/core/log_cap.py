"""The cap on a rank's stored log: its first lines and its latest lines, with a marker between
that says how much was dropped (issue 24: a 200 MiB log used to be cut at 94 MiB, silently,
its last lines lost; the last lines are the ones that say why a trial failed).

A capped log is ``head + marker + tail``: the head is the first quarter of the cap, kept as it
came; the tail the latest output. When the stored log would pass the cap it is rewritten with
the tail shortened to half the cap (so a rewrite is followed by at least a quarter of the cap
of new output before the next: each byte is copied at most about twice). The marker records
the bytes dropped so far, which is also how a restarted control plane finds where it was in
the node's output: ``read offset = stored size - marker length + dropped``.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainhub.core import limits

_MARKER = re.compile(
    rb"\n\[trainhub\] \.\.\. (\d{20}) bytes of output dropped here \(log cap: (\d+) bytes "
    rb"per rank\); the latest output follows \.\.\.\n"
)


def marker(dropped: int, cap_bytes: int) -> bytes:
    return (
        f"\n[trainhub] ... {dropped:020d} bytes of output dropped here (log cap: {cap_bytes} "
        f"bytes per rank); the latest output follows ...\n"
    ).encode()


MAX_MARKER_BYTES = len(marker(0, 2**63))


def find_marker(head: bytes) -> tuple[int, int, int] | None:
    """(start, end, dropped) of the marker in the first bytes of a stored log, or None."""
    found = _MARKER.search(head)
    if found is None:
        return None
    return found.start(), found.end(), int(found.group(1))


@dataclass(frozen=True)
class LogCap:
    """The cap of one rank's stored log, in bytes."""

    cap_bytes: int

    def __post_init__(self) -> None:
        if self.cap_bytes < limits.MIN_LOG_BYTES_PER_RANK:
            raise ValueError(
                f"a rank's log cap must be at least {limits.MIN_LOG_BYTES_PER_RANK} bytes, "
                f"got {self.cap_bytes}"
            )

    @classmethod
    def per_rank(cls, per_trial_bytes: int, world_size: int) -> LogCap:
        """A trial's cap shared evenly by the ranks of an attempt."""
        share = per_trial_bytes // max(1, world_size)
        return cls(max(limits.MIN_LOG_BYTES_PER_RANK, share))

    @property
    def head_bytes(self) -> int:
        return self.cap_bytes // 4

    @property
    def tail_bytes(self) -> int:
        """What the tail is cut to at a rewrite."""
        return self.cap_bytes // 2

    def fits(self, stored: int, incoming: int) -> bool:
        return stored + incoming <= self.cap_bytes

    def rewrite(self, head: bytes, dropped: int, rest: bytes) -> tuple[bytes, int]:
        """The stored log rewritten from its ``head`` (at most :attr:`head_bytes`), the bytes
        ``dropped`` before, and everything after the head (old tail and new output):
        returns the new log and the new dropped count. The tail starts at a line's start
        where one is near, so the first kept line is whole."""
        cut = max(0, len(rest) - self.tail_bytes)
        if cut:
            newline = rest.find(b"\n", cut, cut + 4096)
            if newline != -1:
                cut = newline + 1
        dropped += cut
        return head + marker(dropped, self.cap_bytes) + rest[cut:], dropped

    def behind(self, read: int, log_size: int | None) -> int:
        """Bytes of the node's output to skip: when the reader is more than a cap behind (a
        flood), everything but the latest :attr:`tail_bytes` is dropped unread."""
        if log_size is None or log_size - read <= self.cap_bytes:
            return 0
        return log_size - read - self.tail_bytes
