"""How many metric points a trial may send: per minute (a sliding window) and in all.

A trial over its per-minute budget is answered 429 with the seconds until the window has room
(Retry-After): the runtime keeps the batch, waits and sends it again, so nothing under the
caps is lost, and a flood costs the server one dictionary look-up per refused request (no
database write). Points past the trial's total are dropped and counted: the count is shown
with the trial (``trainhub show``, the API), as are both caps (core/limits.py).

Pure: the caller passes ``now``; the state is a plain dictionary, bounded by ``max_trials``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from trainhub.core import limits

WINDOW_S = 60.0


@dataclass(frozen=True)
class PointCaps:
    """The caps of one server (admins may change the defaults of core/limits.py)."""

    per_minute: int = limits.MAX_METRIC_POINTS_PER_MINUTE
    per_trial: int = limits.MAX_METRIC_POINTS_PER_TRIAL

    def __post_init__(self) -> None:
        if self.per_minute < limits.MAX_POINTS_PER_REQUEST:
            raise ValueError(
                f"per_minute must be at least {limits.MAX_POINTS_PER_REQUEST} (one full "
                f"request of points), got {self.per_minute}"
            )
        if self.per_trial < 1:
            raise ValueError(f"per_trial must be positive, got {self.per_trial}")


def within_total(stored: int, incoming: int, caps: PointCaps) -> tuple[int, int]:
    """Of ``incoming`` points of a trial that stored ``stored``: how many to keep, how many to
    drop (those past the trial's total)."""
    keep = max(0, min(incoming, caps.per_trial - stored))
    return keep, incoming - keep


class PointWindow:
    """The points each trial sent in the last minute, in one-second buckets."""

    def __init__(self, caps: PointCaps, max_trials: int = 100_000) -> None:
        self.caps = caps
        self.max_trials = max_trials
        self._buckets: OrderedDict[int, deque[tuple[int, int]]] = OrderedDict()
        self._sums: dict[int, int] = {}
        self._throttled: dict[int, int] = {}

    def _expire(self, trial_id: int, now: float) -> deque[tuple[int, int]]:
        buckets = self._buckets.get(trial_id)
        if buckets is None:
            buckets = deque()
            self._buckets[trial_id] = buckets
            self._sums[trial_id] = 0
        horizon = now - WINDOW_S
        while buckets and buckets[0][0] <= horizon:
            self._sums[trial_id] -= buckets.popleft()[1]
        return buckets

    def admit(self, trial_id: int, points: int, now: float) -> float | None:
        """Count ``points`` of ``trial_id`` at ``now`` and return None, or refuse them and
        return the seconds until the window has room for them (nothing is counted then)."""
        buckets = self._expire(trial_id, now)
        used = self._sums[trial_id]
        if used + points > self.caps.per_minute:
            self._throttled[trial_id] = self._throttled.get(trial_id, 0) + 1
            freed, wait_s = used, WINDOW_S
            for second, count in buckets:  # oldest first: when will enough have left?
                freed -= count
                if freed + points <= self.caps.per_minute:
                    wait_s = second + WINDOW_S - now
                    break
            return max(1.0, math.ceil(wait_s))
        second = math.floor(now)
        if buckets and buckets[-1][0] == second:
            buckets[-1] = (second, buckets[-1][1] + points)
        else:
            buckets.append((second, points))
        self._sums[trial_id] = used + points
        self._buckets.move_to_end(trial_id)
        while len(self._buckets) > self.max_trials:
            oldest, _ = self._buckets.popitem(last=False)
            self._sums.pop(oldest, None)
            self._throttled.pop(oldest, None)
        return None

    def sent_last_minute(self, trial_id: int, now: float) -> int:
        if trial_id not in self._buckets:
            return 0
        self._expire(trial_id, now)
        return self._sums[trial_id]

    def throttled(self, trial_id: int) -> int:
        """Requests of the trial refused (429) since this server started."""
        return self._throttled.get(trial_id, 0)
