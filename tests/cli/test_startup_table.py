"""The startup table of `trainhub show`: every phase of every attempt readable at 80 columns."""

from __future__ import annotations

from rich.console import Console

from trainhub.cli.startup import startup_table
from trainhub.core.startup import MARKS, format_startup, startup_phases


def _event(attempt: int, warm: bool, step: float) -> dict[str, str]:
    marks = {mark: 1000.0 + i * step for i, mark in enumerate(MARKS)}
    return {"kind": "startup", "message": format_startup(startup_phases(attempt, marks, warm=warm))}


def test_every_phase_and_attempt_reads_in_full_at_80_columns() -> None:
    events = [_event(n, n > 1, 0.25 * n) for n in range(1, 6)] + [{"kind": "x", "message": "y"}]
    console = Console(width=80, record=True)
    console.print(startup_table(events))
    text = console.export_text()

    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for phase in ("queue", "admit", "place", "environment", "start", "import"):
        assert phase in text
    assert "process-group init" in text
    assert "first step" in text
    assert "total" in text
    # the last four attempts, the warm ones marked
    assert "attempt 1" not in text
    assert "attempt 2" in text
    assert "attempt 5" in text
    assert "warm" in text
    assert "10.00" in text  # attempt 5's total: 8 phases of 1.25 s


def test_no_startup_event_is_no_table() -> None:
    assert startup_table([{"kind": "state", "message": "RUNNING"}]) is None
