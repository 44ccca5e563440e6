"""The sweep's decision (ADR 0047): plain values in, decisions out."""

from __future__ import annotations

import pytest

from trainhub.core.checkpoint_leftovers import (
    Keep,
    StoredBlob,
    StoredGroup,
    Sweep,
    TrialWriting,
    UnfinishedUpload,
    judge_leftovers,
)

SET = "tenants/t/checkpoints/trial-1/u1.shards"
NOW = 10_000.0
GRACE = 600.0


def group(key: str | None = SET, trial_id: int = 1, started_at: float = 0.0) -> StoredGroup:
    blobs = (StoredBlob(f"{key}/__0_0.distcp", 100), StoredBlob(f"{key}/.ranks/0.json", 20))
    uploads = (UnfinishedUpload(f"{key}/__1_0.distcp", "up-1", started_at),)
    return StoredGroup(trial_id, key, blobs if key else (), uploads)


def ended(at: float, published: frozenset[str] = frozenset()) -> TrialWriting:
    return TrialWriting(has_open_attempt=False, last_ended_at=at, published=published)


def judge(g: StoredGroup, trial: TrialWriting | None) -> Sweep | Keep:
    (decision,) = judge_leftovers([g], {} if trial is None else {1: trial}, NOW, GRACE)
    return decision


def test_an_unpublished_set_of_an_ended_attempt_goes_after_the_grace() -> None:
    decision = judge(group(), ended(NOW - GRACE))
    assert isinstance(decision, Sweep)
    assert decision.size == 120
    assert [b.key for b in decision.blobs] == [f"{SET}/__0_0.distcp", f"{SET}/.ranks/0.json"]
    assert [u.upload_id for u in decision.uploads] == ["up-1"]


def test_within_the_grace_it_is_kept() -> None:
    decision = judge(group(), ended(NOW - GRACE + 1))
    assert isinstance(decision, Keep)
    assert "grace" in decision.reason


def test_a_running_attempt_s_set_is_never_touched_however_old() -> None:
    running = TrialWriting(has_open_attempt=True, last_ended_at=None, published=frozenset())
    assert isinstance(judge(group(), running), Keep)
    # an earlier attempt ended long ago, but one is open now: nothing says who wrote it
    running = TrialWriting(has_open_attempt=True, last_ended_at=0.0, published=frozenset())
    assert isinstance(judge(group(), running), Keep)


def test_a_published_set_is_never_touched() -> None:
    decision = judge(group(), ended(0.0, frozenset({SET})))
    assert decision == Keep(1, SET, "published")


def test_a_trial_that_never_ran_keeps_its_bytes() -> None:
    never = TrialWriting(has_open_attempt=False, last_ended_at=None, published=frozenset())
    assert isinstance(judge(group(), never), Keep)


def test_a_trial_the_database_no_longer_knows_is_swept() -> None:
    assert isinstance(judge(group(), None), Sweep)


def test_a_young_unfinished_upload_waits_its_own_grace() -> None:
    # a folder store's temporary file in the trial's folder: no checkpoint key, no blobs
    young = StoredGroup(1, None, (), (UnfinishedUpload("x/.tmp-a", ".tmp-a", NOW - 10),))
    assert isinstance(judge(young, ended(0.0)), Keep)
    old = StoredGroup(1, None, (), (UnfinishedUpload("x/.tmp-a", ".tmp-a", NOW - GRACE),))
    swept = judge(old, ended(0.0))
    assert isinstance(swept, Sweep)
    assert swept.uploads == old.uploads
    # with blobs to delete, the young upload stays and the blobs go
    mixed = judge(group(started_at=NOW - 10), ended(0.0))
    assert isinstance(mixed, Sweep)
    assert (len(mixed.blobs), mixed.uploads) == (2, ())


def test_decisions_come_in_the_groups_order_and_grace_must_be_positive() -> None:
    trials = {1: ended(0.0, frozenset({SET})), 2: ended(0.0)}
    decisions = judge_leftovers([group(), group(trial_id=2)], trials, NOW, GRACE)
    assert [type(d) for d in decisions] == [Keep, Sweep]
    with pytest.raises(ValueError, match="grace_s"):
        judge_leftovers([], {}, NOW, -1.0)
