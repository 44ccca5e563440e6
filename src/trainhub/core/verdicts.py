"""The control loop's decisions as data: the verdict on one attempt, and the trial's next state.

The control loop polls each active attempt, hands what it saw to :func:`judge` and carries out
the :data:`Verdict` it gets back; when an attempt ends, :func:`next_trial_state` says where the
trial goes. Both are pure: plain values in, frozen values out, ``now`` injected.

Stopping a trial (preemption or cancel) is a sequence, so that any script can be stopped:

1. the stop is recorded (``RequestStop``): ``should_stop()`` in the runtime turns True;
2. after ``stop_wait_s`` the ranks get SIGTERM on their process groups (``Terminate``), and the
   executor sends SIGKILL to the whole tree ``grace_s`` later (the spec's
   ``preemption.grace_s``, at most ``cancel_grace_s`` for a cancel);
3. once every rank has exited the attempt ends (``EndAttempt``), or ``exit_margin_s`` after the
   grace when the executor cannot say.

What a stopped attempt did on its way out never counts against the trial: a preempted trial
goes back to the queue and is neither failed nor restarted. Neither is a placement that never
became ready: that attempt did not run.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhub.core.attempts import AttemptPhase, AttemptReport, RankPhase
from trainhub.core.isolation import OOM_MARK
from trainhub.core.states import AttemptOutcome, TrialState, check_transition

# a rank's exit code when the runtime refused the spec (runtime/protocol.py EXIT_SPEC_REFUSED;
# the core does not import the runtime, tests/core/test_verdicts.py keeps the two equal)
EXIT_SPEC_REFUSED = 78
# how a rank ends on SIGTERM: killed by it, or the runtime's handler exiting 128 + 15 after
# flushing (runtime/context.py); bwrap reports a sandboxed rank the signal killed the same way
STOPPED_BY_A_PEER = (-15, 143)
# how a rank ends on SIGKILL (the kernel, a person, a node agent): it did not follow a peer
KILLED = (-9, 137)
# a federated client's exit code when its code crashed before it ever joined the federation
# (runtime/federated/supervise.py; the rank's detail is the client's last output line)
EXIT_CLIENT_NEVER_JOINED = 79


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptLimits:
    """Times the control loop allows an attempt (``LoopConfig`` holds the server's values)."""

    # the placement group and actors must be ready by then, or the attempt ends UNPLACED
    placement_timeout_s: float = 300.0
    # how long should_stop() has before SIGTERM
    stop_wait_s: float = 10.0
    # the most a cancel waits between SIGTERM and SIGKILL, whatever the spec's grace
    cancel_grace_s: float = 10.0
    # after SIGTERM + grace, how long the executor has to report the exits before the attempt
    # is ended anyway (its actors are then killed)
    exit_margin_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("placement_timeout_s", "stop_wait_s", "cancel_grace_s", "exit_margin_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFacts:
    """What the database knows of an active trial and its open attempt."""

    state: TrialState
    cancel_requested: bool = False
    stop_reason: str | None = None
    created_at: float  # when the attempt was placed (the placement group was asked for)
    started_at: float | None = None  # when a rank was first seen running
    stop_requested_at: float | None = None  # when should_stop() was turned on
    terminate_sent_at: float | None = None  # when SIGTERM was sent
    grace_s: float = 60.0  # the spec's preemption.grace_s

    @property
    def stopping(self) -> bool:
        return self.cancel_requested or self.state == TrialState.PREEMPTING


# ---------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to change now."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class MarkRunning:
    """A rank runs: SCHEDULED -> RUNNING, and the attempt's run time starts counting."""


@dataclass(frozen=True, slots=True)
class RequestStop:
    """Record the stop: the runtime's should_stop() answers True from now on."""

    reason: str


@dataclass(frozen=True, slots=True)
class Terminate:
    """SIGTERM to every rank's process group now, SIGKILL of the tree ``grace_s`` later."""

    grace_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class EndAttempt:
    """The attempt is over: record ``outcome`` and release its actors.

    ``stop_others``: some ranks may still run (the gang is broken): terminate them first.
    ``exit_codes_final``: ask the executor once more for the exit codes after stopping.
    ``rank``: the rank whose exit the verdict blames (what it said last is the likely cause;
    the ranks stopped after it only say they were stopped).
    """

    outcome: AttemptOutcome
    detail: str
    stop_others: bool = False
    retry: bool = True  # False: another attempt would fail the same way (a refused spec)
    rank: int | None = None


Verdict = Wait | MarkRunning | RequestStop | Terminate | EndAttempt


def judge(facts: AttemptFacts, status: AttemptReport, now: float, limits: AttemptLimits) -> Verdict:
    """The verdict on one attempt of an active trial, from what the executor reports now."""
    if facts.stopping:
        return _judge_stopping(facts, status, now, limits)
    ranks = status.ranks
    if status.phase in (AttemptPhase.UNKNOWN, AttemptPhase.LOST):
        if facts.started_at is None and not any(r.phase == RankPhase.EXITED for r in ranks):
            return EndAttempt(AttemptOutcome.LOST, launch_failed(status.detail or "actors gone"))
        return EndAttempt(
            AttemptOutcome.LOST,
            status.detail or "the attempt's Ray actors are gone",
            stop_others=True,
        )
    if status.phase == AttemptPhase.PLACING:
        waited = now - facts.created_at
        if waited > limits.placement_timeout_s:
            why = f" ({status.detail})" if status.detail else ""
            return EndAttempt(
                AttemptOutcome.UNPLACED,
                f"placement not ready after {limits.placement_timeout_s:.0f} s{why}",
            )
        return Wait(status.detail or "placing")
    failed = [r for r in ranks if r.phase == RankPhase.EXITED and r.exit_code not in (0, None)]
    lost = [r for r in ranks if r.phase == RankPhase.LOST]
    refused = [r for r in failed if r.exit_code == EXIT_SPEC_REFUSED]
    if refused:
        return EndAttempt(
            AttemptOutcome.FAILED,
            f"rank {refused[0].rank} refused the spec (exit code {EXIT_SPEC_REFUSED}); "
            "another attempt would fail the same way, so it is not restarted",
            stop_others=True,
            retry=False,
            rank=refused[0].rank,
        )
    never_joined = [r for r in failed if r.exit_code == EXIT_CLIENT_NEVER_JOINED]
    if never_joined:
        first = never_joined[0]
        return EndAttempt(
            AttemptOutcome.FAILED,
            f"federated client {first.rank - 1} (rank {first.rank}) failed before it joined "
            f"the federation: {first.detail or 'no output'}; another attempt would fail the "
            "same way, so it is not restarted",
            stop_others=True,
            retry=False,
            rank=first.rank,
        )
    if failed:
        # a rank whose end is explained (over its memory) is the cause the others followed;
        # else one killed outright (its peers' collectives then fail with exit 1); else one
        # that did not end on SIGTERM: with no stop asked, only fail-fast sends it, to the
        # ranks of a gang whose peer failed (a poll may see all their ends at once)
        first = next(
            (r for r in failed if r.detail),
            next(
                (r for r in failed if r.exit_code in KILLED),
                next((r for r in failed if r.exit_code not in STOPPED_BY_A_PEER), failed[0]),
            ),
        )
        return EndAttempt(
            AttemptOutcome.FAILED,
            first.detail or f"rank {first.rank} exited with code {first.exit_code}",
            stop_others=True,
            rank=first.rank,
        )
    if lost:
        return EndAttempt(
            AttemptOutcome.LOST,
            f"rank {lost[0].rank} was lost (actor or node died)",
            stop_others=True,
        )
    if ranks and all(r.phase == RankPhase.EXITED for r in ranks):
        return EndAttempt(AttemptOutcome.SUCCEEDED, "every rank exited 0")
    if facts.state == TrialState.SCHEDULED and any(r.phase == RankPhase.RUNNING for r in ranks):
        return MarkRunning()
    return Wait()


def out_of_memory_again(
    detail: str, previous_detail: str | None, *, checkpointed_since: bool
) -> str | None:
    """The trial's final message when a rank ran out of memory again at the same point.

    The same point: the attempt before also ended with a rank over its memory limit, and no
    checkpoint was saved since, so a new attempt would resume where both died. ``None``: a
    restart may help (the first OOM, or progress was made since the last one).
    """
    if OOM_MARK not in detail or not previous_detail or OOM_MARK not in previous_detail:
        return None
    if checkpointed_since:
        return None
    return (
        f"{detail}; the previous attempt exceeded its memory limit at the same point, so it is "
        "not restarted (raise resources.memory_gb_per_worker or use less memory)"
    )


def launch_failed(cause: str) -> str:
    """The state message of an attempt whose launch failed (the executor's own words)."""
    return f"launch failed: {cause}"


def _judge_stopping(
    facts: AttemptFacts, status: AttemptReport, now: float, limits: AttemptLimits
) -> Verdict:
    canceled = facts.cancel_requested
    outcome = AttemptOutcome.KILLED if canceled else AttemptOutcome.PREEMPTED
    reason = facts.stop_reason or ("canceled" if canceled else "preempted")
    ranks = status.ranks
    gone = status.phase in (AttemptPhase.UNKNOWN, AttemptPhase.LOST, AttemptPhase.PLACING)
    if gone or (ranks and all(r.phase in (RankPhase.EXITED, RankPhase.LOST) for r in ranks)):
        # whatever the exits say, they answer the stop: never a failure or a restart
        return EndAttempt(outcome, reason)
    if facts.stop_requested_at is None:
        return RequestStop(reason)
    if facts.terminate_sent_at is None:
        if now - facts.stop_requested_at < limits.stop_wait_s:
            return Wait("waiting for the script to stop (should_stop)")
        grace = min(facts.grace_s, limits.cancel_grace_s) if canceled else facts.grace_s
        return Terminate(grace, reason)
    grace = min(facts.grace_s, limits.cancel_grace_s) if canceled else facts.grace_s
    if now - facts.terminate_sent_at > grace + limits.exit_margin_s:
        return EndAttempt(
            outcome,
            f"{reason}; ranks still not reported exited {grace + limits.exit_margin_s:.0f} s "
            "after SIGTERM",
            stop_others=True,
        )
    return Wait("waiting for the ranks to exit after SIGTERM")


# ---------------------------------------------------------------- the next state


@dataclass(frozen=True, slots=True)
class Transition:
    """Where a trial goes after an attempt ended, and what it shows there."""

    target: TrialState
    message: str | None  # the trial's state message (the cause, for people)
    pending_reason: str | None  # why it waits, when it goes back to the queue
    counts_restart: bool = False

    @property
    def ended(self) -> bool:
        return self.target.is_terminal


def next_trial_state(
    current: TrialState,
    outcome: AttemptOutcome,
    detail: str,
    *,
    num_restarts: int,
    max_restarts: int,
    resume_step: int | None,
    retry: bool = True,
) -> Transition:
    """The trial's next state after an attempt ended with ``outcome`` (checked against the
    transition table). ``resume_step``: the step of the latest checkpoint, if any."""
    resume = f"checkpoint at step {resume_step}" if resume_step is not None else "the beginning"
    if outcome == AttemptOutcome.KILLED:
        made = Transition(TrialState.CANCELED, detail, None)
    elif outcome == AttemptOutcome.SUCCEEDED:
        made = Transition(TrialState.COMPLETED, None, None)
    elif outcome == AttemptOutcome.PREEMPTED:
        # the message keeps the reason once the policy's pending reason replaces it
        note = f"preempted ({detail}); resumes from {resume}"
        made = Transition(TrialState.QUEUED, note, note)
    elif outcome == AttemptOutcome.UNPLACED:
        made = Transition(
            TrialState.QUEUED, detail, f"{detail}; waits to be placed again (not a restart)"
        )
    elif not retry:
        made = Transition(TrialState.FAILED, detail, None)
    elif num_restarts < max_restarts:
        restarts = num_restarts + 1
        made = Transition(
            TrialState.QUEUED,
            detail,
            f"restart {restarts}/{max_restarts} after: {detail}; resumes from {resume}",
            counts_restart=True,
        )
    else:
        made = Transition(
            TrialState.FAILED, f"{detail} (no restarts left of max_restarts={max_restarts})", None
        )
    check_transition(current, made.target)
    return made
