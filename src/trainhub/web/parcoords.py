"""The data of an experiment's parallel-coordinates plot: one axis per hyperparameter that
varies, then the searcher's metric; one line per trial that has a value of it.

Numbers get a linear axis, or a log axis where they are all positive and span more than two
orders of magnitude (learning rates); anything else (categories, booleans, text) gets one
evenly spaced tick per distinct value, in sorted order.
"""

from __future__ import annotations

import math
from typing import Any

from trainhub.service.records import Trial

MAX_LINES = 2000  # trials drawn; a search larger than this shows its first ones


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _axis(name: str, values: list[Any]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    if present and all(_is_number(v) for v in present):
        lo, hi = min(present), max(present)
        log = lo > 0 and hi / lo > 100
        return {"name": name, "kind": "log" if log else "linear", "min": lo, "max": hi}
    ticks = sorted({str(v) for v in present})
    return {"name": name, "kind": "category", "ticks": ticks}


def parcoords_data(
    trials: list[Trial], best: dict[int, float | None], metric: str | None, mode: str
) -> dict[str, Any]:
    """{"axes": [...], "lines": [{"trial": id, "values": [...]}], "mode": "min" | "max"}."""
    chosen = [t for t in trials if best.get(t.id) is not None][:MAX_LINES]
    names = sorted({k for t in chosen for k in t.hparams})
    varying = [n for n in names if len({repr(t.hparams.get(n)) for t in chosen}) > 1] or names
    axes = [_axis(n, [t.hparams.get(n) for t in chosen]) for n in varying]
    metric_values = [best[t.id] for t in chosen]
    axes.append({**_axis(metric or "metric", metric_values), "metric": True})
    lines = []
    for t in chosen:
        values: list[Any] = []
        for axis in axes[:-1]:
            v = t.hparams.get(axis["name"])
            values.append(str(v) if axis["kind"] == "category" and v is not None else v)
        values.append(best[t.id])
        lines.append({"trial": t.id, "values": values})
    return {"axes": axes, "lines": lines, "mode": mode}
