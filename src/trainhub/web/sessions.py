"""Browser sessions: an opaque id in an httpOnly cookie maps to the API token it logged in with.

The token is authenticated again on every request (a revoked token ends its sessions at once);
each session carries the CSRF token its forms must send back. Sessions live in the control
plane's memory: a restart logs everyone out, which is acceptable for one control plane.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

SESSION_COOKIE = "trainhub_session"
LOGIN_CSRF_COOKIE = "trainhub_login_csrf"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Session:
    secret: str  # the API token
    csrf: str
    expires_at: float


class Sessions:
    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, secret: str) -> tuple[str, Session]:
        sid = secrets.token_urlsafe(32)
        session = Session(secret, secrets.token_urlsafe(32), time.time() + self.ttl_s)
        with self._lock:
            self._by_id[sid] = session
            while len(self._by_id) > self.max_sessions:
                self._by_id.popitem(last=False)  # the oldest logins go first
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.expires_at < time.time():
                del self._by_id[sid]
                return None
            return session

    def close(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._by_id.pop(sid, None)
