"""How many live-update streams are open, per browser session and in all (bounded)."""

from __future__ import annotations

import threading

from trainhub.core import limits


class StreamSlots:
    """Counts open streams per session and in all."""

    def __init__(
        self,
        per_session: int = limits.MAX_LIVE_STREAMS_PER_SESSION,
        total: int = limits.MAX_LIVE_STREAMS,
    ) -> None:
        self.per_session = per_session
        self.total = total
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, sid: str) -> str | None:
        """None when a slot was taken, else why not."""
        with self._lock:
            if sum(self._open.values()) >= self.total:
                return f"{self.total} live streams are open on this server"
            if self._open.get(sid, 0) >= self.per_session:
                return f"{self.per_session} live pages are open in this session: close some"
            self._open[sid] = self._open.get(sid, 0) + 1
            return None

    def give_back(self, sid: str) -> None:
        with self._lock:
            left = self._open.get(sid, 0) - 1
            if left > 0:
                self._open[sid] = left
            else:
                self._open.pop(sid, None)

    def count(self, sid: str | None = None) -> int:
        with self._lock:
            return sum(self._open.values()) if sid is None else self._open.get(sid, 0)
