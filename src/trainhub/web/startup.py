"""The trial page's startup table: each attempt's phases from submit to its first optimizer
step (trainhub.core.startup), read from the trial's ``startup`` events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainhub.core.startup import EVENT_KIND, PHASES, StartupPhases, label, parse_startup
from trainhub.service.records import TrialEvent


def startup_context(events: Iterable[TrialEvent]) -> dict[str, Any]:
    """``startups`` (one per attempt, in order) and ``startup_phases`` (column labels)."""
    found: dict[int, StartupPhases] = {}
    for event in events:
        if event.kind == EVENT_KIND:
            parsed = parse_startup(event.message)
            if parsed is not None:
                found[parsed.attempt] = parsed
    rows = [found[n] for n in sorted(found)]
    shown = [p for p in PHASES if any(p in r.phases for r in rows)]
    return {"startups": rows, "startup_phases": [(p, label(p)) for p in shown]}
