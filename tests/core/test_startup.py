"""Startup phases from marks, and their event text read back."""

from __future__ import annotations

from trainhub.core.startup import (
    MARKS,
    PHASES,
    StartupPhases,
    format_startup,
    parse_startup,
    startup_phases,
)


def marks_every(step_s: float, start: float = 1_700_000_000.0) -> dict[str, float | None]:
    return {name: start + i * step_s for i, name in enumerate(MARKS)}


def test_each_phase_runs_from_one_mark_to_the_next() -> None:
    marks = marks_every(0.5)
    phases = startup_phases(1, marks)
    assert list(phases.phases) == list(PHASES)
    assert all(abs(v - 0.5) < 1e-9 for v in phases.phases.values())
    assert phases.total_s is not None
    assert abs(phases.total_s - 0.5 * len(PHASES)) < 1e-9


def test_a_missing_mark_leaves_out_the_phases_around_it() -> None:
    marks = marks_every(0.25)
    marks["spawned_at"] = None
    phases = startup_phases(2, marks)
    assert "environment" not in phases.phases
    assert "start" not in phases.phases
    assert {"place", "import"} <= set(phases.phases)


def test_clock_skew_never_makes_a_phase_negative() -> None:
    marks = marks_every(1.0)
    marks["actor_at"] = marks["launched_at"] - 0.2  # type: ignore[operator]
    assert startup_phases(1, marks).phases["place"] == 0.0


def test_event_text_reads_back() -> None:
    original = startup_phases(3, marks_every(0.123), warm=True)
    text = format_startup(original)
    assert text.startswith("attempt 3 (warm): queue 0.123 s, ")
    assert "process-group init" in text
    rounded = {p: round(v, 3) for p, v in original.phases.items()}
    total = round(original.total_s or 0, 3)
    assert parse_startup(text) == StartupPhases(3, rounded, total, warm=True)


def test_other_event_text_is_not_a_startup() -> None:
    for text in ("attempt 1 placed on node-a", "attempt x: queue 1 s", "attempt 1: bogus 2 s", ""):
        assert parse_startup(text) is None
