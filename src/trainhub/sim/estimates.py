"""The duration estimates a control plane would show a policy, kept for a simulation.

The server (``service.scheduling_view``) estimates a trial's run time from what it read last
of the finished trials: every ``estimates_refresh_s``, at a tick, it reads the run times of
the latest ``FINISHED_RUNS_READ`` completed trials, each the sum of its attempts' run times
as the control loop measured them (``measured_run_s``), and remakes the facts of the queued
and active trials whose estimate changed. ``ServerEstimates`` keeps those books for the
simulator: a finish becomes visible at the first refresh at or after the tick that saw it,
the window drops the oldest run, and :meth:`publish` names the tracked jobs whose estimate
changed, so the simulator remakes their facts as the server does (issue 27: parity under
duration estimates).
"""

from __future__ import annotations

import math

from trainhub.core.scheduling.view import DurationEstimates

Key = tuple[str, str]  # (user, project)


def measured_run_s(started_at: float, seen_end_at: float, tick_s: float) -> float:
    """An attempt's run time as the control loop writes it: from the tick that saw it
    running (the first after its launch) to the tick that saw it end; an attempt that ended
    before that first tick counts from its launch.

    >>> measured_run_s(0.0, 600.0, 60.0), measured_run_s(0.0, 60.0, 60.0)
    (540.0, 60.0)
    """
    seen_running = started_at + tick_s
    if tick_s and seen_end_at > seen_running:
        return seen_end_at - seen_running
    return seen_end_at - started_at


class ServerEstimates:
    """Finished runs published on the server's refresh schedule; the estimates handed out.

    Refreshes fall on a grid from ``origin`` (the control loop's first tick): every
    ``refresh_s`` rounded up to whole ticks (the loop refreshes at the first tick at least
    ``refresh_s`` after the last refresh), at every instant when ``refresh_s`` is 0.
    """

    def __init__(
        self,
        min_samples: int,
        window: int | None,
        refresh_s: float,
        tick_s: float,
        origin: float,
    ) -> None:
        self.estimates = DurationEstimates(min_samples, window)
        if refresh_s and tick_s:
            refresh_s = math.ceil(refresh_s / tick_s - 1e-9) * tick_s
        self.period = refresh_s
        self.origin = origin
        self.refreshed_at = -math.inf
        # finishes not yet read by a refresh: (seen at, job id, key, run time)
        self._pending: list[tuple[float, int, Key, float]] = []
        # the estimate each key was last handed out with, and the jobs holding it
        self._given: dict[Key, float | None] = {}
        self._jobs: dict[Key, set[int]] = {}
        self._keys_of_user: dict[str, set[Key]] = {}
        self._keys_of_project: dict[str, set[Key]] = {}

    def estimate(self, job_id: int, key: Key, track: bool = True) -> float | None:
        """The estimate a new fact of ``job_id`` carries now. A tracked job is named by a
        later refresh that changes it (until :meth:`forget`); an untracked one is not (its
        policy does not read it in that state: see ``BasePolicy.reads_queued_durations``)."""
        if key not in self._given:
            self._given[key] = self.estimates.estimate(*key)
            self._keys_of_user.setdefault(key[0], set()).add(key)
            self._keys_of_project.setdefault(key[1], set()).add(key)
        if track:
            self._jobs.setdefault(key, set()).add(job_id)
        else:
            self.forget(job_id, key)
        return self._given[key]

    def forget(self, job_id: int, key: Key) -> None:
        """The job left the books (finished): its facts are not remade any more."""
        jobs = self._jobs.get(key)
        if jobs is not None:
            jobs.discard(job_id)

    def finished(self, seen_at: float, job_id: int, key: Key, run_s: float) -> None:
        """A completion the loop saw at ``seen_at`` with ``run_s`` measured over its
        attempts; the server reads only runs longer than 0."""
        if run_s > 0:
            self._pending.append((seen_at, job_id, key, run_s))

    def publish(self, now: float) -> dict[int, float | None]:
        """Read the finishes up to the last refresh at or before ``now``; the tracked jobs
        whose estimate that changed, with their new estimate."""
        if self.period:
            steps = math.floor((now - self.origin) / self.period + 1e-9)
            refresh = self.origin + steps * self.period
        else:
            refresh = now
        if refresh <= self.refreshed_at or not self._pending:
            self.refreshed_at = max(self.refreshed_at, refresh)
            return {}
        self.refreshed_at = refresh
        pending = self._pending
        cut = 0
        while cut < len(pending) and pending[cut][0] <= refresh:
            cut += 1
        if not cut:
            return {}
        read, self._pending = sorted(pending[:cut]), pending[cut:]
        touched: set[Key] = set()
        for _, _, key, run_s in read:
            self.estimates.add(*key, run_s)
            touched |= self._keys_of_user.get(key[0], set())
            touched |= self._keys_of_project.get(key[1], set())
        changed: dict[int, float | None] = {}
        for key in touched:
            new = self.estimates.estimate(*key)
            if new == self._given[key]:
                continue
            self._given[key] = new
            for job_id in self._jobs.get(key, ()):
                changed[job_id] = new
        return changed
