"""The verdict on an attempt and the next trial state, on plain values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trainhub.core.attempts import AttemptPhase, RankPhase
from trainhub.core.errors import IllegalTransition
from trainhub.core.states import AttemptOutcome, TrialState
from trainhub.core.verdicts import (
    EXIT_SPEC_REFUSED,
    AttemptFacts,
    AttemptLimits,
    EndAttempt,
    MarkRunning,
    RequestStop,
    Terminate,
    Wait,
    judge,
    next_trial_state,
    out_of_memory_again,
)

LIMITS = AttemptLimits(placement_timeout_s=300, stop_wait_s=10, cancel_grace_s=5, exit_margin_s=30)


@dataclass(frozen=True)
class Rank:
    rank: int
    phase: RankPhase
    exit_code: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Status:
    phase: AttemptPhase
    ranks: tuple[Rank, ...] = ()
    detail: str = ""


RUNNING = Status(AttemptPhase.RUNNING, (Rank(0, RankPhase.RUNNING), Rank(1, RankPhase.RUNNING)))


def facts(**kw: object) -> AttemptFacts:
    base: dict[str, object] = {"state": TrialState.RUNNING, "created_at": 0.0, "started_at": 1.0}
    base.update(kw)
    return AttemptFacts(**base)  # type: ignore[arg-type]


def test_placing_waits_until_the_timeout_then_ends_unplaced() -> None:
    placing = Status(AttemptPhase.PLACING, detail="waiting for resources")
    f = facts(state=TrialState.SCHEDULED, started_at=None)
    assert judge(f, placing, 300.0, LIMITS) == Wait("waiting for resources")
    verdict = judge(f, placing, 301.0, LIMITS)
    assert verdict == EndAttempt(
        AttemptOutcome.UNPLACED, "placement not ready after 300 s (waiting for resources)"
    )


def test_running_exits_failures_and_losses() -> None:
    assert judge(facts(state=TrialState.SCHEDULED), RUNNING, 5, LIMITS) == MarkRunning()
    assert judge(facts(), RUNNING, 5, LIMITS) == Wait()
    done = Status(AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, 0), Rank(1, RankPhase.EXITED, 0)))
    assert judge(facts(), done, 5, LIMITS) == EndAttempt(
        AttemptOutcome.SUCCEEDED, "every rank exited 0"
    )
    broken = Status(
        AttemptPhase.RUNNING, (Rank(0, RankPhase.RUNNING), Rank(1, RankPhase.EXITED, 2))
    )
    assert judge(facts(), broken, 5, LIMITS) == EndAttempt(
        AttemptOutcome.FAILED, "rank 1 exited with code 2", stop_others=True, rank=1
    )
    lost = Status(AttemptPhase.LOST, detail="rank 0 lost: node died")
    assert judge(facts(), lost, 5, LIMITS).outcome == AttemptOutcome.LOST  # type: ignore[union-attr]
    never_ran = judge(facts(started_at=None), lost, 5, LIMITS)
    assert isinstance(never_ran, EndAttempt)
    assert never_ran.detail == "launch failed: rank 0 lost: node died"


def test_stopping_asks_then_sigterms_then_gives_up() -> None:
    f = facts(state=TrialState.PREEMPTING, stop_reason="tenant b's guarantee", grace_s=60)
    assert judge(f, RUNNING, 0, LIMITS) == RequestStop("tenant b's guarantee")
    f = facts(state=TrialState.PREEMPTING, stop_reason="r", grace_s=60, stop_requested_at=100.0)
    assert isinstance(judge(f, RUNNING, 109, LIMITS), Wait)
    assert judge(f, RUNNING, 110, LIMITS) == Terminate(60, "r")
    sent = facts(
        state=TrialState.PREEMPTING,
        stop_reason="r",
        grace_s=60,
        stop_requested_at=100.0,
        terminate_sent_at=110.0,
    )
    assert isinstance(judge(sent, RUNNING, 200, LIMITS), Wait)
    given_up = judge(sent, RUNNING, 200.5, LIMITS)
    assert isinstance(given_up, EndAttempt)
    assert given_up.outcome == AttemptOutcome.PREEMPTED
    # exits while stopping answer the stop, whatever their codes
    killed = Status(AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, -9),))
    assert judge(sent, killed, 120, LIMITS) == EndAttempt(AttemptOutcome.PREEMPTED, "r")
    # a cancel waits at most cancel_grace_s between SIGTERM and SIGKILL
    cancel = facts(cancel_requested=True, stop_reason="c", grace_s=60, stop_requested_at=0.0)
    assert judge(cancel, RUNNING, 10, LIMITS) == Terminate(5, "c")


def test_next_state_never_charges_preemption_or_placement() -> None:
    def after(outcome: AttemptOutcome, restarts: int = 0) -> tuple[TrialState, bool]:
        t = next_trial_state(
            TrialState.RUNNING, outcome, "d", num_restarts=restarts, max_restarts=1, resume_step=3
        )
        return t.target, t.counts_restart

    assert after(AttemptOutcome.PREEMPTED) == (TrialState.QUEUED, False)
    assert after(AttemptOutcome.UNPLACED) == (TrialState.QUEUED, False)
    assert after(AttemptOutcome.FAILED) == (TrialState.QUEUED, True)
    assert after(AttemptOutcome.LOST, restarts=1) == (TrialState.FAILED, False)
    assert after(AttemptOutcome.SUCCEEDED) == (TrialState.COMPLETED, False)
    assert after(AttemptOutcome.KILLED) == (TrialState.CANCELED, False)
    with pytest.raises(IllegalTransition):
        next_trial_state(
            TrialState.QUEUED,
            AttemptOutcome.SUCCEEDED,
            "",
            num_restarts=0,
            max_restarts=0,
            resume_step=None,
        )


def test_a_refused_spec_is_not_restarted() -> None:
    refused = Status(AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, EXIT_SPEC_REFUSED),))
    verdict = judge(facts(), refused, 10, LIMITS)
    assert isinstance(verdict, EndAttempt)
    assert (verdict.outcome, verdict.retry) == (AttemptOutcome.FAILED, False)
    failed = Status(AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, 1),))
    assert judge(facts(), failed, 10, LIMITS).retry  # type: ignore[union-attr]
    t = next_trial_state(
        TrialState.RUNNING,
        AttemptOutcome.FAILED,
        "d",
        num_restarts=0,
        max_restarts=3,
        resume_step=None,
        retry=False,
    )
    assert (t.target, t.counts_restart) == (TrialState.FAILED, False)


def test_the_core_and_the_runtime_agree_on_the_refused_spec_exit_code() -> None:
    from trainhub.runtime import protocol

    assert protocol.EXIT_SPEC_REFUSED == EXIT_SPEC_REFUSED


def test_a_rank_killed_for_its_memory_gives_the_attempt_its_reason() -> None:
    oom = "rank 1 exceeded its 1 GiB memory limit: peak 1.0 GiB"
    status = Status(
        AttemptPhase.EXITED,
        (Rank(0, RankPhase.EXITED, -15), Rank(1, RankPhase.EXITED, -9, oom)),
    )
    verdict = judge(facts(state=TrialState.RUNNING, started_at=1.0), status, 10.0, LIMITS)
    assert isinstance(verdict, EndAttempt)
    assert verdict.detail == oom  # the explained failure, not rank 0 stopped after it


def test_the_rank_that_failed_is_blamed_not_the_one_fail_fast_stopped() -> None:
    """Rank 1 was killed; rank 0, SIGTERM'd by fail-fast, flushed and exited 143. A poll that
    sees both blames rank 1 (it named rank 0 and its last metrics line before)."""
    for stopped in (143, -15):
        status = Status(
            AttemptPhase.EXITED,
            (Rank(0, RankPhase.EXITED, stopped), Rank(1, RankPhase.EXITED, -9)),
        )
        verdict = judge(facts(state=TrialState.RUNNING, started_at=1.0), status, 10.0, LIMITS)
        assert verdict == EndAttempt(
            AttemptOutcome.FAILED, "rank 1 exited with code -9", stop_others=True, rank=1
        )
    # rank 0's collective failed when its killed peer vanished (exit 1): rank 1 is the cause
    status = Status(
        AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, 1), Rank(1, RankPhase.EXITED, -9))
    )
    verdict = judge(facts(state=TrialState.RUNNING, started_at=1.0), status, 10.0, LIMITS)
    assert isinstance(verdict, EndAttempt)
    assert verdict.rank == 1
    # every rank ended on SIGTERM (something outside the gang sent it): the first is named
    both = Status(
        AttemptPhase.EXITED, (Rank(0, RankPhase.EXITED, 143), Rank(1, RankPhase.EXITED, -15))
    )
    verdict = judge(facts(state=TrialState.RUNNING, started_at=1.0), both, 10.0, LIMITS)
    assert isinstance(verdict, EndAttempt)
    assert verdict.rank == 0


def test_a_second_oom_at_the_same_point_is_final() -> None:
    oom = "rank 0 exceeded its 1 GiB memory limit: peak 1.0 GiB"
    final = out_of_memory_again(oom, oom, checkpointed_since=False)
    assert final is not None
    assert final.startswith(oom)
    assert "not restarted" in final
    # progress since the first one: a restart may get further
    assert out_of_memory_again(oom, oom, checkpointed_since=True) is None
    # the first OOM, or an OOM after another failure: restarted as usual
    assert out_of_memory_again(oom, None, checkpointed_since=False) is None
    assert out_of_memory_again(oom, "rank 0 exited with code 1", checkpointed_since=False) is None
    assert out_of_memory_again("rank 0 exited with code 1", oom, checkpointed_since=False) is None


def test_a_federated_client_that_never_joined_fails_once_with_its_last_line() -> None:
    from trainhub.core.verdicts import EXIT_CLIENT_NEVER_JOINED

    ranks = (
        Rank(0, RankPhase.EXITED, -15),  # the server, stopped by the client's fail-fast
        Rank(2, RankPhase.EXITED, EXIT_CLIENT_NEVER_JOINED, "RuntimeError: no weights"),
    )
    verdict = judge(facts(), Status(AttemptPhase.EXITED, ranks), 10, LIMITS)
    assert isinstance(verdict, EndAttempt)
    assert (verdict.outcome, verdict.retry) == (AttemptOutcome.FAILED, False)
    assert verdict.detail.startswith("federated client 1 (rank 2) failed before it joined")
    assert "RuntimeError: no weights" in verdict.detail
