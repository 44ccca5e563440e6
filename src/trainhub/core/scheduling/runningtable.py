"""The running trials of a snapshot, pre-grouped so that a pass does not regroup them.

A :class:`RunningTable` is an immutable tuple of
:class:`~trainhub.core.scheduling.snapshot.RunningTrial` that also holds them by tenant, the
slots each tenant holds, the trials being preempted and those with an expected end. A caller
that changes a few trials between passes (the simulator) derives the next table with
:meth:`RunningTable.updated`, which only regroups the tenants it touches; a plain tuple works
too and is grouped by :meth:`RunningTable.coerce`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from trainhub.core.scheduling.snapshot import RunningTrial

_TRIAL_ID = operator.attrgetter("trial_id")


class RunningTable(tuple[RunningTrial, ...]):
    by_id: dict[int, RunningTrial]
    by_tenant: dict[str, tuple[RunningTrial, ...]]
    slots_by_tenant: dict[str, int]
    # trials being preempted, and trials not being preempted with an expected end
    preempting: tuple[RunningTrial, ...]
    with_known_end: tuple[RunningTrial, ...]

    def __new__(cls, trials: Iterable[RunningTrial] = ()) -> RunningTable:
        by_id = {t.trial_id: t for t in trials}
        table = super().__new__(cls, by_id.values())
        table.by_id = by_id
        groups: dict[str, list[RunningTrial]] = {}
        for trial in table:
            groups.setdefault(trial.tenant, []).append(trial)
        table.by_tenant = {t: tuple(g) for t, g in groups.items()}
        table.slots_by_tenant = {
            t: sum(r.request.num_slots for r in trials) for t, trials in table.by_tenant.items()
        }
        table.preempting = tuple(t for t in table if t.preempting)
        table.with_known_end = tuple(
            t for t in table if not t.preempting and t.expected_duration_s is not None
        )
        return table

    @classmethod
    def coerce(cls, running: Sequence[RunningTrial]) -> RunningTable:
        return running if isinstance(running, RunningTable) else cls(running)

    def synced(self, trials: Iterable[RunningTrial]) -> RunningTable:
        """A table of exactly ``trials`` (read afresh by a caller that keeps its table between
        passes), derived from this one: only the tenants whose trials changed are regrouped,
        so caches keyed by the other tenants' groups stay valid. Unchanged trials should be
        the same objects as before (an identity check); equal copies cost a comparison."""
        fresh = {t.trial_id: t for t in trials}
        known = self.by_id
        removed = [i for i in known if i not in fresh]
        changed = [t for i, t in fresh.items() if (k := known.get(i)) is not t and k != t]
        if not removed and not changed:
            return self
        if len(removed) + len(changed) > len(fresh) // 2:
            return RunningTable(fresh.values())
        return self.updated(changed, removed)

    def updated(
        self, changed: Iterable[RunningTrial] = (), removed: Iterable[int] = ()
    ) -> RunningTable:
        """A new table with ``changed`` trials added or replaced (by id) and ``removed`` gone.

        Only the tenants of those trials are regrouped.
        """
        by_id = dict(self.by_id)
        dropped: dict[str, set[int]] = {}
        added: dict[str, list[RunningTrial]] = {}
        for trial_id in removed:
            gone = by_id.pop(trial_id)
            dropped.setdefault(gone.tenant, set()).add(trial_id)
        for trial in changed:
            old = by_id.get(trial.trial_id)
            if old is not None:
                dropped.setdefault(old.tenant, set()).add(old.trial_id)
            by_id[trial.trial_id] = trial
            added.setdefault(trial.tenant, []).append(trial)
        table = tuple.__new__(RunningTable, by_id.values())
        table.by_id = by_id
        by_tenant = dict(self.by_tenant)
        slots = dict(self.slots_by_tenant)
        for tenant in set(dropped) | set(added):
            gone_ids = dropped.get(tenant, set())
            before = by_tenant.get(tenant, ())
            kept = list(before)
            held = slots.get(tenant, 0)
            if gone_ids:
                # a few leave a long group: find them by id (integer comparisons at C speed)
                ids = list(map(_TRIAL_ID, before))
                for at in sorted((ids.index(i) for i in gone_ids if i in ids), reverse=True):
                    held -= kept.pop(at).request.num_slots
            new_here = added.get(tenant, ())
            kept.extend(new_here)
            held += sum(t.request.num_slots for t in new_here)
            if kept:
                by_tenant[tenant] = tuple(kept)
                slots[tenant] = held
            else:
                by_tenant.pop(tenant, None)
                slots.pop(tenant, None)
        table.by_tenant = by_tenant
        table.slots_by_tenant = slots
        everything = set().union(*dropped.values()) if dropped else set()
        new = [t for ts in added.values() for t in ts]
        table.preempting = tuple(
            [t for t in self.preempting if t.trial_id not in everything]
            + [t for t in new if t.preempting]
        )
        table.with_known_end = tuple(
            [t for t in self.with_known_end if t.trial_id not in everything]
            + [t for t in new if not t.preempting and t.expected_duration_s is not None]
        )
        return table
