"""The "startup" table of `trainhub show` (a trial's view): each attempt's start, phase by
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


def startup_table(events: Iterable[Mapping[str, Any]], last: int = 4) -> Table | None:
    """One row per phase (seconds), then the total; one column per attempt, the ``last`` ones
    (so that eight phases fit 80 columns); None if no attempt recorded its start."""
    rows = startups(events)[-last:]
    if not rows:
        return None
    title = "startup (s, submit to first step)"
    table = Table(title=title, title_justify="left", show_edge=False, min_width=len(title))
    table.add_column("phase", no_wrap=True)
    for row in rows:
        table.add_column(f"attempt {row.attempt}" + ("\nwarm" if row.warm else ""), justify="right")
    for phase in [p for p in PHASES if any(p in r.phases for r in rows)]:
        cells = [f"{row.phases[phase]:.2f}" if phase in row.phases else "-" for row in rows]
        table.add_row(label(phase), *cells)
    totals = [f"{row.total_s:.2f}" if row.total_s is not None else "-" for row in rows]
    table.add_row("total", *totals, style="bold")
    return table
