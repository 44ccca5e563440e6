"""One refresh of the duration estimates, as the server's control loop makes it every minute.

5,000 queued trials of one user and project; each of 20 refreshes reads one more finished run
of theirs, which changes their estimate. Timed: ``SchedulingView.apply`` at that tick, which
remakes the facts of the trials whose estimate the policy reads
(``BasePolicy.reads_queued_durations`` / ``reads_running_durations``, ADR 0036 fifth
amendment). Baseline, in the same run: the same policy told it reads every trial's estimate,
as every policy was treated before (each refresh remade every trial whose estimate changed).

    PYTHONPATH=src:. .venv/bin/python benchmarks/estimate_refresh.py  # the tests' records

One JSON line per policy: ``median_ms``, ``remake_all_ms`` and their ratio.
"""

from __future__ import annotations

import json
import statistics
import time

from tests.service.test_scheduling_view import apply, trial

from trainhub.core.scheduling import (
    BasePolicy,
    FairSharePolicy,
    FifoPolicy,
    LeastAttainedServicePolicy,
    ShortestJobFirstPolicy,
)
from trainhub.service.records import TrialOwner
from trainhub.service.scheduling_view import SchedulingView

QUEUED = 5000
REFRESHES = 20


def refresh_ms(policy: BasePolicy) -> float:
    view = SchedulingView(policy, half_life_s=3600.0)
    view._owners = {i: TrialOwner(i, "ann", "p") for i in range(1, QUEUED + 1)}
    apply(view, [trial(i) for i in range(1, QUEUED + 1)], whole=True)
    runs = [("ann", "p", 60.0), ("ann", "p", 120.0)]
    times = []
    for k in range(REFRESHES):
        runs.append(("ann", "p", 100.0 + 37.0 * k))
        view._finished = list(runs)  # what SchedulingView.read reads every estimates_refresh_s
        view._estimates_at = 50.0 + k
        start = time.perf_counter()
        apply(view, [])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    makers = (FifoPolicy, FairSharePolicy, LeastAttainedServicePolicy, ShortestJobFirstPolicy)
    for make in makers:
        policy = make()
        baseline = make()
        baseline.reads_queued_durations = baseline.reads_running_durations = True
        ms, all_ms = refresh_ms(policy), refresh_ms(baseline)
        print(
            json.dumps(
                {
                    "benchmark": "estimate_refresh",
                    "policy": policy.name,
                    "queued": QUEUED,
                    "median_ms": round(ms, 3),
                    "remake_all_ms": round(all_ms, 3),
                    "ratio": round(ms / all_ms, 4),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
