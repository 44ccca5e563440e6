"""The sweep of checkpoint bytes nobody will publish (ADR 0047), on the control loop's cadence.

Reads what the store holds under every tenant's ``checkpoints/`` (committed blobs and
unfinished writes), groups it by checkpoint key, asks the database which trials may still
write and which checkpoints are registered, hands both to the pure
:func:`~trainhub.core.checkpoint_leftovers.judge_leftovers`, and carries out its sweeps:
unfinished uploads aborted, blobs deleted, one event on the trial saying how many bytes went.

The store is read before the database: a group listed while an attempt wrote it is then seen
with that attempt open, or ended less than the grace ago, and kept.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from trainhub.core.checkpoint_leftovers import (
    Keep,
    StoredBlob,
    StoredGroup,
    Sweep,
    TrialWriting,
    UnfinishedUpload,
    judge_leftovers,
)
from trainhub.core.states import TrialState
from trainhub.service.clock import Clock
from trainhub.service.keys import SET_SUFFIX
from trainhub.service.ports import ArtifactStore
from trainhub.service.repository import Repository, UnitOfWork

log = logging.getLogger(__name__)

_WRITING_STATES = (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING)


def checkpoint_group(key: str) -> tuple[int, str | None] | None:
    """``(trial id, checkpoint key)`` of a key under ``tenants/T/checkpoints/trial-N/``: the
    set's prefix for a member or report of ``UUID.shards/``, the key itself for a one-file
    checkpoint, None for a writer's temporary file in the trial's folder. None for a key
    outside any trial's checkpoints."""
    parts = key.split("/")
    if len(parts) < 5 or parts[0] != "tenants" or parts[2] != "checkpoints":
        return None
    folder = parts[3]
    if not folder.startswith("trial-") or not folder[len("trial-") :].isdigit():
        return None
    trial_id = int(folder[len("trial-") :])
    head = "/".join(parts[:5])
    if len(parts) > 5:
        return (trial_id, head) if parts[4].endswith(SET_SUFFIX) else None
    return (trial_id, None if parts[4].startswith(".tmp-") else head)


@dataclass
class SweepReport:
    swept: list[Sweep] = field(default_factory=list)
    kept: list[Keep] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(s.size for s in self.swept)


class CheckpointLeftovers:
    """Finds and deletes the bytes of checkpoints that never published and never will."""

    def __init__(self, uow: UnitOfWork, store: ArtifactStore, clock: Clock, grace_s: float):
        if grace_s < 0:
            raise ValueError("grace_s must be >= 0")
        self.uow = uow
        self.store = store
        self.clock = clock
        self.grace_s = grace_s

    def sweep(self) -> SweepReport:
        with self.uow() as repo:
            tenants = [t.name for t in repo.list_tenants()]
        groups = self._stored(tenants)  # the store first (see the module's docstring)
        report = SweepReport()
        if not groups:
            return report
        with self.uow() as repo:
            trials = _trials_writing(repo, sorted({g.trial_id for g in groups}))
        for decision in judge_leftovers(groups, trials, self.clock(), self.grace_s):
            if isinstance(decision, Keep):
                report.kept.append(decision)
            else:
                self._apply(decision)
                report.swept.append(decision)
        if report.swept:
            self._record(report.swept, trials)
        return report

    def _stored(self, tenants: list[str]) -> list[StoredGroup]:
        blobs: dict[tuple[int, str | None], list[StoredBlob]] = defaultdict(list)
        uploads: dict[tuple[int, str | None], list[UnfinishedUpload]] = defaultdict(list)
        for tenant in tenants:
            prefix = f"tenants/{tenant}/checkpoints/"
            for blob in self.store.list(prefix):
                where = checkpoint_group(blob.key)
                if where is not None:
                    blobs[where].append(StoredBlob(blob.key, blob.size))
            for upload in self.store.list_unfinished(prefix):
                where = checkpoint_group(upload.key)
                if where is not None:
                    uploads[where].append(upload)
        return [
            StoredGroup(
                trial_id, key, tuple(blobs[(trial_id, key)]), tuple(uploads[(trial_id, key)])
            )
            for trial_id, key in sorted(set(blobs) | set(uploads), key=lambda w: (w[0], w[1] or ""))
        ]

    def _apply(self, sweep: Sweep) -> None:
        for upload in sweep.uploads:
            self.store.abort_unfinished(upload)
        for blob in sweep.blobs:
            self.store.delete(blob.key)
        log.info(
            "swept checkpoint %s of trial %d: %d objects (%d bytes), %d unfinished uploads: %s",
            sweep.storage_key or "writes",
            sweep.trial_id,
            len(sweep.blobs),
            sweep.size,
            len(sweep.uploads),
            sweep.reason,
        )

    def _record(self, swept: list[Sweep], trials: dict[int, TrialWriting]) -> None:
        by_trial: dict[int, list[Sweep]] = defaultdict(list)
        for sweep in swept:
            if sweep.trial_id in trials:
                by_trial[sweep.trial_id].append(sweep)
        if not by_trial:
            return
        now = self.clock()
        with self.uow() as repo:
            for trial_id, sweeps in sorted(by_trial.items()):
                objects = sum(len(s.blobs) for s in sweeps)
                aborted = sum(len(s.uploads) for s in sweeps)
                repo.add_event(
                    trial_id,
                    "checkpoint",
                    f"deleted {objects} objects ({sum(s.size for s in sweeps)} bytes) and "
                    f"{aborted} unfinished uploads of checkpoints never published "
                    "(an attempt ended before it registered them)",
                    now,
                )


def _trials_writing(repo: Repository, trial_ids: list[int]) -> dict[int, TrialWriting]:
    found: dict[int, TrialWriting] = {}
    for trial_id in trial_ids:
        trial = repo.get_trial(trial_id)
        if trial is None:
            continue
        attempts = repo.list_attempts(trial_id)
        open_ = trial.state in _WRITING_STATES or any(a.ended_at is None for a in attempts)
        ended = [a.ended_at for a in attempts if a.ended_at is not None]
        found[trial_id] = TrialWriting(
            has_open_attempt=open_,
            last_ended_at=None if open_ or not ended else max(ended),
            published=frozenset(c.storage_key for c in repo.list_checkpoints(trial_id)),
        )
    return found
