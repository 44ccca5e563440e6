"""``trainhub show --trial``'s "startup" table: where each attempt's start went, phase by
phase, from the trial's ``startup`` events (trainhub.core.startup)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from trainhub.core.startup import EVENT_KIND, PHASES, StartupPhases, label, parse_startup


def startups(events: Iterable[Mapping[str, Any]]) -> list[StartupPhases]:
    """The startup phases of every attempt the events tell of, by attempt."""
    found = {}
    for event in events:
        if event.get("kind") == EVENT_KIND:
            parsed = parse_startup(str(event.get("message", "")))
            if parsed is not None:
                found[parsed.attempt] = parsed
    return [found[n] for n in sorted(found)]


def startup_table(events: Iterable[Mapping[str, Any]]) -> Table | None:
    """One row per attempt, one column per phase (seconds), then the total; None if none."""
    rows = startups(events)
    if not rows:
        return None
    table = Table(title="startup (s, submit to first step)", title_justify="left")
    table.add_column("attempt", justify="right")
    shown = [p for p in PHASES if any(p in r.phases for r in rows)]
    for phase in shown:
        table.add_column(label(phase), justify="right")
    table.add_column("total", justify="right", style="bold")
    for row in rows:
        cells = [f"{row.phases[p]:.2f}" if p in row.phases else "-" for p in shown]
        total = f"{row.total_s:.2f}" if row.total_s is not None else "-"
        table.add_row(f"{row.attempt}{' warm' if row.warm else ''}", *cells, total)
    return table
