"""The best-so-far curve of a search (as Optuna's optimization history and Determined's
"best so far" show it): the trials with a value of the searcher's metric in the order they
finished (those still running after, by id), each trial's value, and the running best of them
in the metric's mode."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TrialValue:
    trial_id: int
    ended_at: float | None  # None: still running (or never ended)
    value: float | None  # its best value of the metric so far


def best_so_far(trials: Iterable[TrialValue], mode: str) -> dict[str, list[float] | list[int]]:
    """``{"x": [1, 2, ...], "trials": [ids], "values": [...], "best": [...]}``; ``best`` never
    worsens (non-increasing for ``min``, non-decreasing for ``max``)."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode: {mode!r} is neither 'min' nor 'max'")
    chosen = [t for t in trials if t.value is not None and math.isfinite(t.value)]
    chosen.sort(key=lambda t: (t.ended_at is None, t.ended_at or 0.0, t.trial_id))
    pick = min if mode == "min" else max
    values: list[float] = []
    best: list[float] = []
    for t in chosen:
        assert t.value is not None
        values.append(t.value)
        best.append(t.value if not best else pick(best[-1], t.value))
    return {
        "x": list(range(1, len(chosen) + 1)),
        "trials": [t.trial_id for t in chosen],
        "values": values,
        "best": best,
    }
