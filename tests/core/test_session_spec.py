"""The sessions' pure rules: durations, GPU limits at submit, the idle verdict."""

from __future__ import annotations

import pytest

from trainhub.core.errors import InvalidSpec
from trainhub.core.session_spec import (
    Activity,
    SessionLimits,
    SessionSpec,
    gpu_errors,
    idle_verdict,
    parse_duration,
)
from trainhub.core.spec import parse_spec


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 1.5h ", 5400.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--idle-timeout") == seconds


@pytest.mark.parametrize("text", ["", "m", "30 minutes", "-5m", "1e3"])
def test_a_bad_duration_names_the_option(text: str) -> None:
    with pytest.raises(ValueError, match="--idle-timeout"):
        parse_duration(text, "--idle-timeout")


def test_gpus_beyond_the_tenants_session_limit_or_its_cap_are_refused_with_the_field() -> None:
    assert gpu_errors(2, SessionLimits(max_gpus=2), tenant_limit_slots=8) == []
    assert gpu_errors(4, SessionLimits(), tenant_limit_slots=None) == []
    (over_session,) = gpu_errors(3, SessionLimits(max_gpus=2), tenant_limit_slots=None)
    assert over_session.path == "gpus"
    assert "at most 2" in over_session.message
    (over_tenant,) = gpu_errors(9, SessionLimits(), tenant_limit_slots=8)
    assert "never hold more than 8" in over_tenant.message
    assert len(gpu_errors(9, SessionLimits(max_gpus=4), tenant_limit_slots=8)) == 2


def test_a_session_is_idle_from_its_last_activity_unless_a_connection_is_open() -> None:
    started = 1000.0
    fresh = Activity(started, None, 0)
    assert not idle_verdict(fresh, 60.0, started + 59).cull
    verdict = idle_verdict(fresh, 60.0, started + 60)
    assert verdict.cull
    assert "idle for 60 s" in verdict.reason
    used = Activity(started, started + 50, 0)
    assert not idle_verdict(used, 60.0, started + 100).cull
    assert idle_verdict(used, 60.0, started + 110).cull
    connected = Activity(started, started, 1)  # a browser tab with an open WebSocket
    kept = idle_verdict(connected, 60.0, started + 10_000)
    assert not kept.cull
    assert kept.idle_s == 0.0


def test_a_session_ends_at_its_tenants_longest_length_even_in_use() -> None:
    connected = Activity(1000.0, 4000.0, 2)
    verdict = idle_verdict(connected, 60.0, 4600.0, max_length_s=3600.0)
    assert verdict.cull
    assert "longest session" in verdict.reason


def test_the_spec_takes_a_session_section_with_bounded_timeouts() -> None:
    spec = parse_spec(
        "name: nb\nentrypoint: python -m trainhub.runtime.session_server\n"
        "session: {kind: notebook, idle_timeout_s: 600}\n"
    )
    assert spec.session == SessionSpec(idle_timeout_s=600)
    with pytest.raises(InvalidSpec) as caught:
        parse_spec("name: nb\nentrypoint: x\nsession: {kind: desktop, idle_timeout_s: 1}\n")
    paths = {e.path for e in caught.value.errors}
    assert paths == {"session.kind", "session.idle_timeout_s"}
