"""The pure rules of issue 24's write limits: metric point caps, the log cap, write quotas."""

from __future__ import annotations

import pytest

from trainhub.core import limits
from trainhub.core.log_cap import LogCap, find_marker, marker
from trainhub.core.metric_budget import PointCaps, PointWindow, within_total
from trainhub.core.write_quota import TrialWritten, over_quota

GiB = 1024**3


def test_the_window_refuses_past_the_minute_cap_and_says_when_there_is_room() -> None:
    window = PointWindow(PointCaps(per_minute=3000, per_trial=10**6))
    assert window.admit(1, 1000, now=0.0) is None
    assert window.admit(1, 1000, now=10.0) is None
    assert window.admit(1, 1000, now=20.0) is None
    wait = window.admit(1, 1000, now=30.0)
    assert wait == 30.0  # the points of t=0 leave the window at t=60
    assert window.throttled(1) == 1
    assert window.sent_last_minute(1, now=30.0) == 3000  # a refusal counts nothing
    assert window.admit(2, 1000, now=30.0) is None  # another trial has its own budget
    assert window.admit(1, 1000, now=60.5) is None
    assert window.sent_last_minute(1, now=60.5) == 3000


def test_the_window_forgets_the_least_recent_trials() -> None:
    window = PointWindow(PointCaps(per_minute=1000, per_trial=10), max_trials=2)
    for trial in (1, 2, 3):
        assert window.admit(trial, 1000, now=0.0) is None
    assert window.sent_last_minute(1, now=1.0) == 0
    assert window.sent_last_minute(3, now=1.0) == 1000


def test_points_past_the_total_are_dropped() -> None:
    caps = PointCaps(per_minute=limits.MAX_POINTS_PER_REQUEST, per_trial=100)
    assert within_total(0, 60, caps) == (60, 0)
    assert within_total(60, 60, caps) == (40, 20)
    assert within_total(100, 5, caps) == (0, 5)


def test_caps_below_one_request_are_refused() -> None:
    with pytest.raises(ValueError, match="per_minute"):
        PointCaps(per_minute=10)


def test_a_rewrite_keeps_the_head_a_marker_and_the_latest_whole_lines() -> None:
    cap = LogCap(limits.MIN_LOG_BYTES_PER_RANK)
    head = b"h" * cap.head_bytes
    rest = b"".join(f"line {i}\n".encode() for i in range(20_000))
    data, dropped = cap.rewrite(head, 0, rest)
    found = find_marker(data[: cap.head_bytes + 200])
    assert found is not None
    start, end, counted = found
    assert start == cap.head_bytes
    assert counted == dropped == len(rest) - len(data[end:])
    assert data[end:].startswith(b"line ")  # a whole line first
    assert data.endswith(b"line 19999\n")  # the last line kept
    assert len(data) <= cap.head_bytes + len(marker(dropped, cap.cap_bytes)) + cap.tail_bytes


def test_a_trial_cap_is_shared_by_its_ranks_with_a_floor() -> None:
    assert LogCap.per_rank(8 * 1024**2, 4).cap_bytes == 2 * 1024**2
    assert LogCap.per_rank(1024, 4).cap_bytes == limits.MIN_LOG_BYTES_PER_RANK
    assert LogCap(1024**2).behind(read=0, log_size=10 * 1024**2) == 10 * 1024**2 - 512 * 1024
    assert LogCap(1024**2).behind(read=0, log_size=1024**2) == 0


def test_write_quota_names_the_numbers() -> None:
    written = TrialWritten(7, "vision", checkpoint_bytes=0, disk_bytes=2 * GiB)
    reason = over_quota(written, GiB // 5, 2 * GiB, 10 * GiB)
    assert reason is not None
    assert "trial 7 holds 2.00 GiB" in reason
    assert "quota is 0.20 GiB" in reason
    tenant = over_quota(written, 10 * GiB, 12 * GiB, 11 * GiB)
    assert tenant is not None
    assert "tenant 'vision' holds 12.00 GiB" in tenant
    assert over_quota(written, 10 * GiB, 3 * GiB, 11 * GiB) is None
