"""The active trials and their open attempts, as the control loop judges them each tick.

Kept between ticks from the numbered changes (ADR 0024, ADR 0025): a tick reads the trials
changed since the last one (their state, cancel, stop reason and start) and the open attempts
of those alone; every other active trial and its attempt are as they were, because everything
an attempt is judged by is numbered when it changes (a trial's state, cancel and stop reason;
any write to its attempt). Every ``resync_s`` it reads them all again: a change written around
the repository would be found there.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainhub.service.records import ActiveRecord, Attempt
from trainhub.service.repository import Repository


class ObservedTrials:
    def __init__(self, resync_s: float = 300.0) -> None:
        self.resync_s = resync_s
        self._records: dict[int, ActiveRecord] = {}
        self._attempts: dict[int, Attempt] = {}
        self._mark: int | None = None
        self._synced_at = float("-inf")

    def read(
        self, repo: Repository, now: float
    ) -> tuple[list[ActiveRecord], Mapping[int, Attempt]]:
        """Every active trial by id, and the open attempt of each that has one, as committed
        now: the changes since the last read applied (everything at the first read and every
        ``resync_s``)."""
        resync = self._mark is None or now - self._synced_at >= self.resync_s
        changes = repo.active_changes(None if resync else self._mark)
        records, attempts = self._records, self._attempts
        if changes.whole:
            records.clear()
            attempts.clear()
            self._synced_at = now
        active = [r for r in changes.records if r.state.is_active]
        for record in changes.records:
            if not record.state.is_active:
                records.pop(record.id, None)
                attempts.pop(record.id, None)
        opened = repo.open_attempts([r.id for r in active]) if active else {}
        for record in active:
            records[record.id] = record
            attempt = opened.get(record.id)
            if attempt is None:
                attempts.pop(record.id, None)
            else:
                attempts[record.id] = attempt
        self._mark = changes.mark
        return [records[i] for i in sorted(records)], attempts
