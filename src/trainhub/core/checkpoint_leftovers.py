"""Which stored checkpoint bytes nobody will ever publish: the sweep's decision (ADR 0047).

A checkpoint's bytes reach the store before the database lists it: a one-file checkpoint
is streamed (a temporary file beside its key, or an S3 multipart upload) and then
registered; a sharded one is one object per rank's file plus the ranks' reports, published
by the last report (ADR 0040). An attempt that ends before that (a rank killed mid-upload,
a node lost, a preemption before every rank reported) leaves those bytes: invisible, never
counted by a quota (quotas count registered checkpoints), and never deleted by retention
(which deletes registered ones). This module decides which of them go.

The rule, per group (everything stored under one checkpoint key of one trial):
  * a group the database lists (published) is never touched;
  * a group of a trial with an attempt open (scheduled, running, stopping) is kept: the
    attempt may still be writing it, and nothing in an object says which attempt wrote it;
  * a group of a trial that never had an attempt is kept (a PBT child's copied checkpoint
    is written before its row, in one search tick);
  * otherwise, once ``grace_s`` has passed since the trial's last attempt ended (a rank of
    a lost node may still be finishing an upload it began before), it is swept; an
    unfinished upload is swept only once it is itself ``grace_s`` old.
A group of a trial the database does not know (its rows deleted) is swept.

Pure: plain values in, frozen decisions out; no clock (``now`` is given), no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredBlob:
    key: str
    size: int


@dataclass(frozen=True)
class UnfinishedUpload:
    """A write begun and never completed: an S3 multipart upload, or a writer's temporary
    file on a folder store. ``started_at``: when it began (seconds since the epoch)."""

    key: str
    upload_id: str
    started_at: float


@dataclass(frozen=True)
class StoredGroup:
    """What the store holds under one checkpoint key of one trial: ``storage_key`` is the
    key a registered checkpoint would have (``.../UUID.ckpt`` or ``.../UUID.shards``), or
    None for an unfinished upload whose target is not known (a folder store's temporary
    file directly in the trial's folder)."""

    trial_id: int
    storage_key: str | None
    blobs: tuple[StoredBlob, ...] = ()
    uploads: tuple[UnfinishedUpload, ...] = ()

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blobs)


@dataclass(frozen=True)
class TrialWriting:
    """What the database says about whether a trial may still write checkpoints."""

    has_open_attempt: bool
    # when its last attempt ended; None: it never had one (or its attempt is open)
    last_ended_at: float | None
    published: frozenset[str]  # storage keys of its registered, not deleted, checkpoints


@dataclass(frozen=True)
class Sweep:
    """Delete ``blobs`` and abort ``uploads`` of one group."""

    trial_id: int
    storage_key: str | None
    blobs: tuple[StoredBlob, ...]
    uploads: tuple[UnfinishedUpload, ...]
    reason: str

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blobs)


@dataclass(frozen=True)
class Keep:
    trial_id: int
    storage_key: str | None
    reason: str


def judge_leftovers(
    groups: Sequence[StoredGroup],
    trials: Mapping[int, TrialWriting],
    now: float,
    grace_s: float,
) -> list[Sweep | Keep]:
    """One decision per group, in the order given."""
    if grace_s < 0:
        raise ValueError("grace_s must be >= 0")
    return [_judge(group, trials.get(group.trial_id), now, grace_s) for group in groups]


def _judge(
    group: StoredGroup, trial: TrialWriting | None, now: float, grace_s: float
) -> Sweep | Keep:
    def keep(reason: str) -> Keep:
        return Keep(group.trial_id, group.storage_key, reason)

    if trial is None:
        return Sweep(
            group.trial_id, group.storage_key, group.blobs, group.uploads, "its trial is gone"
        )
    if group.storage_key is not None and group.storage_key in trial.published:
        return keep("published")
    if trial.has_open_attempt:
        return keep("its trial has an attempt open: it may still be writing")
    if trial.last_ended_at is None:
        return keep("its trial has not run yet")
    ended_s = now - trial.last_ended_at
    if ended_s < grace_s:
        return keep(f"its trial's attempt ended {ended_s:.0f} s ago (grace {grace_s:.0f} s)")
    uploads = tuple(u for u in group.uploads if now - u.started_at >= grace_s)
    if not group.blobs and not uploads:
        return keep(f"its uploads began less than {grace_s:.0f} s ago")
    return Sweep(
        group.trial_id,
        group.storage_key,
        group.blobs,
        uploads,
        f"never published; its trial's last attempt ended {ended_s:.0f} s ago",
    )
