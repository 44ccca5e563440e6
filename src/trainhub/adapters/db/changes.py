"""Numbered changes of what the scheduler reads of a trial, so a tick reads only what changed.

A transaction that changes a trial's scheduling columns (state, priority, queue time, attained
service, progress) or what its attempt is judged by (a cancel, a stop's reason, its start),
adds or changes one of its attempts or registers one of its checkpoints marks the trial
(:func:`touch`). At commit the marked trials get the next number of a counter row
(``change_counters``, name "trials") in their ``change_seq`` (:func:`stamp`, installed on a
session factory by :func:`track`). A reader asks for the trials whose number is above the
highest it has seen (``SqlRepository.scheduling_changes`` for the scheduler,
``SqlRepository.active_changes`` for the observation of attempts).

Why a counter row and not a sequence (ADR 0024): numbers must become visible in the order
they are given, or a reader that saw number 11 could skip a number 10 committed after it. The
counter's row lock is held from the increment to the commit, so a transaction that takes the
next number waits until the one before it has committed (PostgreSQL); SQLite has one writer at
a time anyway. The trials' rows are locked before the counter's, so a transaction that holds the
counter never waits for a trial row held by one that waits for the counter. The rows are locked
FOR NO KEY UPDATE, the lock an UPDATE of them takes: FOR UPDATE would also wait for the
key-share lock that inserting a checkpoint or attempt takes on its trial (the foreign key), and
a transaction that inserted one would wait for this one's row in turn, a deadlock
(``test_a_checkpoint_registered_while_the_loop_changes_its_trial_does_not_deadlock``). The
counter's lock is taken at the commit, so it is held for two statements.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Table, event, select
from sqlalchemy import update as sa_update
from sqlalchemy.orm import Session, sessionmaker

from trainhub.adapters.db.models import ChangeCounterRow, TrialRow

COUNTER = "trials"
_TRIALS = cast("Table", TrialRow.__table__)
_COUNTER = cast("Table", ChangeCounterRow.__table__)
_TOUCHED = "trainhub_touched_trials"
_CHUNK = 500

# the trial columns whose change the control loop must see: what the scheduler reads, and
# what an attempt is judged by (a cancel, a stop's reason); a pending note is not one of them
# (the control loop writes those itself, every tick)
NUMBERED_COLUMNS = frozenset(
    {
        "state",
        "priority",
        "queued_at",
        "attained_service",
        "progress_s",
        "cancel_requested",
        "stop_reason",
        "started_at",
    }
)


def touch(session: Session, trial_ids: Iterable[int]) -> None:
    """Mark these trials as changed by the session's transaction (numbered at its commit)."""
    session.info.setdefault(_TOUCHED, set()).update(trial_ids)


def stamp(session: Session) -> None:
    """Give the trials this transaction marked the counter's next number (before commit)."""
    touched: set[int] | None = session.info.pop(_TOUCHED, None)
    if not touched:
        return
    ids = sorted(touched)
    chunks = [ids[at : at + _CHUNK] for at in range(0, len(ids), _CHUNK)]
    # plain statements on the connection: an ORM statement would look for the rows among the
    # session's objects to keep them in step (most of a small commit's time, and nothing here
    # reads change_seq from an object)
    connection = session.connection()
    trials, counter = _TRIALS.c, _COUNTER.c
    if connection.dialect.name != "sqlite":  # SQLite has one writer: there is nothing to lock
        for chunk in chunks:  # rows first, in id order, then the counter (the module's note)
            connection.execute(
                select(trials.id).where(trials.id.in_(chunk)).with_for_update(key_share=True)
            )
    number = connection.execute(
        sa_update(_COUNTER)
        .where(counter.name == COUNTER)
        .values(value=counter.value + 1)
        .returning(counter.value)
    ).scalar_one()
    for chunk in chunks:
        connection.execute(sa_update(_TRIALS).where(trials.id.in_(chunk)).values(change_seq=number))


def _forget(session: Session, *_: Any) -> None:
    session.info.pop(_TOUCHED, None)


def track(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """Number the marked changes of every session ``sessions`` makes, at its commit."""
    event.listen(sessions, "before_commit", stamp)
    event.listen(sessions, "after_rollback", _forget)
    return sessions
