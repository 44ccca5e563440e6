"""The limit on failed authentications: per address, per presented token and per principal.

A request's token is always checked first: a valid token is never refused by this limit,
whoever failed before it from the same address (an admin behind the same NAT as a guessing
script, a second tenant's trial on the same node as a flooding one). Only failures are
counted and only failures are refused (429 instead of 401): the limit stops a client from
learning anything by volume, and tells a broken client to back off, without being a lever
one client can pull to lock out another.

Failures are counted under several keys at once, each with its own sliding window:

- ``token:<first 10 characters>``: the presented token's prefix (what ``tokens list``
  shows): a client retrying one revoked or mistyped token is slowed on that token only;
- ``principal:<who>``: the user or trial of a token that exists but no longer works
  (revoked, expired, disabled user);
- ``address:<ip>``: the client address, except for the cluster's own nodes (and loopback):
  every trial on a node shares its address, so an address-wide lock-out there would let one
  trial's bad requests refuse its neighbours' (issue 24). With a network namespace per trial
  a trial has an address of its own, which is not a node's, and is limited as a whole again.

Tokens carry 256 random bits: guessing one is hopeless with or without the limit; the limit
bounds the work and the log noise of floods. Memory is bounded: at most ``max_keys`` keys
are remembered (the least recently failing are forgotten first).
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from trainhub.core import limits

TOKEN_PREFIX_CHARS = 10  # as many as the token listing shows (service.auth.new_token)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class NodeAddresses:
    """The addresses of the cluster's nodes, read again at most every ``refresh_s``.

    ``read`` is the executor's (Ray's node list); loopback always counts as this node's.
    A read that fails keeps the last known set.
    """

    def __init__(
        self,
        read: Callable[[], Iterable[str]],
        refresh_s: float = limits.NODE_ADDRESSES_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._clock = clock
        self._known: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, address: str) -> bool:
        if is_loopback(address):
            return True
        with self._lock:
            if self._clock() - self._read_at >= self._refresh_s:
                self._read_at = self._clock()
                # the cluster may be down: keep what was known
                with contextlib.suppress(Exception):
                    self._known = frozenset(self._read())
            return address in self._known


def _never(_address: str) -> bool:
    return False


class FailedAuthLimiter:
    """Failed authentications per key in a sliding window of ``window_s`` seconds.

    A key with ``max_failures`` failures in the window is limited until the oldest of them
    leaves it; a failing request is refused (429) while any of its keys is limited.
    ``exempt(address)`` says which client addresses are never limited as a whole (the
    cluster's own nodes, see :class:`NodeAddresses`).
    """

    def __init__(
        self,
        max_failures: int = limits.MAX_FAILED_AUTH_PER_WINDOW,
        window_s: float = limits.FAILED_AUTH_WINDOW_S,
        max_keys: int = limits.MAX_FAILED_AUTH_KEYS,
        clock: Callable[[], float] = time.monotonic,
        exempt: Callable[[str], bool] = _never,
        max_addresses: int | None = None,  # the older name of max_keys
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_keys = max_addresses if max_addresses is not None else max_keys
        self.exempt = exempt
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    # --- the keys of one failure ---

    def keys(self, address: str, token: str | None, subject: str | None = None) -> list[str]:
        """What a failed request from ``address`` presenting ``token`` counts against."""
        found = []
        if token:
            found.append(f"token:{token[:TOKEN_PREFIX_CHARS]}")
        if subject:
            found.append(f"principal:{subject}")
        if not self.exempt(address):
            found.append(f"address:{address}")
        return found

    def refusal(self, keys: Iterable[str]) -> tuple[str, float] | None:
        """The limited key with the longest wait and that wait in seconds; None: not limited."""
        worst: tuple[str, float] | None = None
        for key in keys:
            wait_s = self.retry_after_s(key)
            if wait_s is not None and (worst is None or wait_s > worst[1]):
                worst = (key, wait_s)
        return worst

    def record(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.failed(key)

    # --- one key ---

    def _recent(self, key: str) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        horizon = self._clock() - self.window_s
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after_s(self, key: str) -> float | None:
        """Seconds until ``key`` may fail again unrefused; None when it may now."""
        with self._lock:
            times = self._recent(key)
            if times is None or len(times) < self.max_failures:
                return None
            return max(0.0, times[0] + self.window_s - self._clock())

    def failed(self, key: str) -> None:
        with self._lock:
            times = self._recent(key) or deque(maxlen=self.max_failures)
            times.append(self._clock())
            self._failures[key] = times
            self._failures.move_to_end(key)
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)


def describe(key: str) -> str:
    """A limited key in words, for the 429's message."""
    kind, _, value = key.partition(":")
    if kind == "token":
        return f"the token {value}..."
    if kind == "principal":
        return value
    return value
