"""The rule every backend applies to a key before it touches storage."""

from __future__ import annotations

from trainhub.core.errors import InvalidRequest


def check_key(key: str) -> str:
    """``key`` when it is a relative '/'-separated path inside the store, else InvalidRequest.

    Refused: empty keys, absolute keys, empty, ``.`` or ``..`` segments, NUL bytes. The same
    key is then the same blob on a folder and in a bucket.
    """
    parts = key.split("/")
    if not key or "\x00" in key or any(p in ("", ".", "..") for p in parts):
        raise InvalidRequest(
            f"artifact key {key!r} leaves the artifact store",
            "use a relative '/'-separated path without empty, '.' or '..' segments",
        )
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty (everything) or the start of a valid key."""
    if prefix:
        check_key(prefix.rstrip("/") or ".")
    return prefix
