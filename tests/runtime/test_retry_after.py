"""The runtime waits what a 429's Retry-After asks before it sends again (issue 24), and a
refusal for the storage quota is told apart from other refusals."""

from __future__ import annotations

import httpx
import pytest

from trainhub.runtime.transport import (
    Backoff,
    ControlPlaneError,
    TransientError,
    Waker,
    _check,
    retry_transient,
)


class Recording(Waker):
    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_retry_after_wins_over_a_shorter_back_off() -> None:
    answers: list[TransientError | str] = [
        TransientError("HTTP 429", retry_after_s=7.0),
        TransientError("HTTP 503"),
        "ok",
    ]

    def call(_budget_s: float) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    waker = Recording()
    result = retry_transient(
        call,
        what="POST metrics",
        deadline=lambda: float("inf"),
        backoff=Backoff(0.05, 1.0),
        waker=waker,
    )
    assert result == "ok"
    assert waker.slept[0] == 7.0
    assert waker.slept[1] < 1.0  # no Retry-After: the back-off as before


def _response(status: int, body: dict[str, str], **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def test_a_429_carries_its_retry_after_and_a_413_its_code() -> None:
    with pytest.raises(TransientError) as throttled:
        _check(_response(429, {"code": "rate_limited"}, **{"Retry-After": "42"}), "POST metrics")
    assert throttled.value.retry_after_s == 42.0
    with pytest.raises(TransientError) as odd:
        _check(_response(429, {}, **{"Retry-After": "soon"}), "POST metrics")
    assert odd.value.retry_after_s is None
    with pytest.raises(ControlPlaneError) as quota:
        _check(_response(413, {"code": "storage_quota_exceeded"}), "POST metrics")
    assert quota.value.over_quota
    with pytest.raises(ControlPlaneError) as large:
        _check(_response(413, {"code": "too_large"}), "POST metrics")
    assert not large.value.over_quota
