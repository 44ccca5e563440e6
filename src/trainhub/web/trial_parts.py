"""Parts of the trial page built for the page and again for its live stream: the "where the
time goes" table (core/step_timing.py, as ``trainhub show --trial``), the attempts on a timeline
with their table, and the layer-health alerts."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from trainhub.core.step_timing import split_metrics, step_timing
from trainhub.service.experiments import TrialDetail
from trainhub.service.records import Attempt, Trial
from trainhub.web.site import templates
from trainhub.web.startup import startup_context

MIN_BAR_PCT = 0.6  # an attempt of a few seconds in a day-long trial still shows


def node_label(node_id: str, hosts: Mapping[str, str]) -> str:
    """A node as people name it: its hostname where an agent reported one, else the start of
    its id (Ray's ids are 56 characters)."""
    return hosts.get(node_id) or (node_id if len(node_id) <= 16 else node_id[:12] + "…")


def placement_nodes(placement: Sequence[str], hosts: Mapping[str, str]) -> list[dict[str, Any]]:
    """An attempt's nodes in rank order, each once, with its label and how many ranks it ran."""
    counts: dict[str, int] = {}
    for node_id in placement:
        counts[node_id] = counts.get(node_id, 0) + 1
    return [
        {"id": node_id, "label": node_label(node_id, hosts), "ranks": n}
        for node_id, n in counts.items()
    ]


def timeline(
    attempts: Sequence[Attempt], now: float, hosts: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One bar per attempt, from its start (or creation) to its end (or ``now``), placed as
    percentages of the span from the first attempt's start to the last one's end."""
    hosts = hosts or {}
    if not attempts:
        return []
    spans = []
    for a in attempts:
        start = a.started_at or a.created_at
        end = a.ended_at if a.ended_at is not None else max(now, start)
        spans.append((a, start, max(end, start)))
    t0 = min(s for _, s, _ in spans)
    t1 = max(e for _, _, e in spans)
    width = max(t1 - t0, 1e-9)
    bars = []
    for a, start, end in spans:
        left = 100 * (start - t0) / width
        pct = max(MIN_BAR_PCT, 100 * (end - start) / width)
        reason = a.outcome or "running"
        if a.detail:
            reason += f": {a.detail}"
        bars.append(
            {
                "number": a.number,
                "left": round(min(left, 100 - pct), 3),
                "width": round(pct, 3),
                "outcome": a.outcome or "RUNNING",
                "nodes": ", ".join(n["label"] for n in placement_nodes(a.placement, hosts))
                or "unplaced",
                "reason": reason,
                "seconds": end - start,
            }
        )
    return bars


def parts_context(
    detail: TrialDetail, hosts: Mapping[str, str] | None = None, now: float | None = None
) -> dict[str, Any]:
    """What the three parts' templates need; ``hosts`` names nodes (node id: hostname)."""
    hosts = hosts or {}
    now = time.time() if now is None else now
    trial: Trial = detail.trial
    _, profiling = split_metrics(trial.latest_metrics or {})
    return {
        "trial": trial,
        "attempts": detail.attempts,
        "timeline": timeline(detail.attempts, now, hosts),
        "now": now,
        "attempt_nodes": {a.number: placement_nodes(a.placement, hosts) for a in detail.attempts},
        "timing": step_timing(profiling),
        "timing_step": (trial.latest_metrics or {}).get("step"),
        "alerts": detail.alerts,
        "traffic": detail.traffic,
        **startup_context(detail.events),
    }


def render_parts(detail: TrialDetail, hosts: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parts as HTML, for the live stream: ``timing``, ``attempts``, ``alerts``."""
    context = parts_context(detail, hosts)
    return {
        name: templates.get_template(f"_trial_{name}.html").render(**context)
        for name in ("timing", "attempts", "alerts")
    }
