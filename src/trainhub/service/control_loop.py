"""The control loop: one tick observes running attempts, then schedules queued trials.

It decides nothing itself. Each tick polls every attempt the database says is active (logs are
appended to the store) and hands what it saw to the pure :func:`~trainhub.core.verdicts.judge`;
it carries out the verdict (mark running, ask to stop, SIGTERM, end the attempt) and, when an
attempt ends, moves the trial where :func:`~trainhub.core.verdicts.next_trial_state` says. Then
it hands a snapshot to the scheduling policy and carries out its decisions. After a
control-plane restart the same tick reconciles: attempts whose Ray actors are gone end LOST,
orphan actors nobody owns are released.

It is the single writer of the states of active trials; every state change goes through
:func:`~trainhub.service.trial_writes.write_trial` (the transition table).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from trainhub.core.fairshare import DecayedUsage
from trainhub.core.federated_spec import FEDERATED_ENV, launch_argv, launch_env
from trainhub.core.gcpause import collection_paused
from trainhub.core.isolation import OOM_MARK
from trainhub.core.limits import DEFAULT_MAX_LOG_BYTES_PER_TRIAL
from trainhub.core.log_cap import LogCap
from trainhub.core.resources import ResourceRequest
from trainhub.core.scheduling import BasePolicy, Pending, Preempt, Start
from trainhub.core.searcher_metric import failure_at_end
from trainhub.core.spec import ExperimentSpec
from trainhub.core.states import AttemptOutcome, TrialState
from trainhub.core.verdicts import (
    AttemptFacts,
    AttemptLimits,
    EndAttempt,
    MarkRunning,
    RequestStop,
    Terminate,
    Transition,
    Verdict,
    judge,
    launch_failed,
    next_trial_state,
    out_of_memory_again,
)
from trainhub.runtime import protocol
from trainhub.service.auth import new_token
from trainhub.service.checkpoint_leftovers import CheckpointLeftovers, SweepReport
from trainhub.service.clock import Clock
from trainhub.service.environments import (
    EnvironmentBuilding,
    EnvironmentFailed,
    EnvironmentReady,
    EnvironmentService,
)
from trainhub.service.experiments import refresh_experiment_state
from trainhub.service.failed_attempts import judge_failed_attempt
from trainhub.service.keys import attempt_key, log_key
from trainhub.service.monitoring import MonitoringService
from trainhub.service.observed_trials import ObservedTrials
from trainhub.service.ports import (
    ArtifactStore,
    AttemptLaunch,
    AttemptStatus,
    Executor,
    TrialFiles,
)
from trainhub.service.records import (
    KEEP,
    ActiveRecord,
    Attempt,
    AttemptUpdate,
    SchedulingRecord,
    Trial,
    TrialUpdate,
)
from trainhub.service.repository import Repository, UnitOfWork
from trainhub.service.scheduling_view import SchedulingView
from trainhub.service.search_ports import TrialHooks
from trainhub.service.traffic import TrafficMeter
from trainhub.service.trial_logs import LogPosition, RankLogs
from trainhub.service.trial_writes import write_trial
from trainhub.service.write_quotas import WriteQuotas

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Ending:
    """An attempt to end, its output drained, its actors not released yet."""

    trial_id: int
    attempt: Attempt | None
    verdict: EndAttempt
    detail: str
    exit_codes: tuple[int | None, ...]


@dataclass(frozen=True)
class _Started:
    """An attempt recorded for a trial started, to launch once its transaction committed
    (``secret``: its runtime token, known only here)."""

    trial: Trial
    attempt: Attempt
    spec: ExperimentSpec
    raw_spec: dict[str, Any]  # as submitted: the sections passed on to the runtime as they are
    context_key: str | None
    secret: str
    environment: EnvironmentReady | None = None  # the trial's own packages (ADR 0026)


ACTIVE_STATES = (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING)


@dataclass(frozen=True)
class LoopConfig:
    api_url: str
    placement_timeout_s: float = 300.0
    # the most a cancel waits between SIGTERM and SIGKILL (preemption uses the spec's grace)
    terminate_grace_s: float = 10.0
    # how long a stopping trial's should_stop() has before its ranks get SIGTERM
    stop_wait_s: float = 10.0
    # after SIGTERM + grace: how long before an attempt whose exits never came is ended anyway
    exit_margin_s: float = 30.0
    trial_token_ttl_s: float = 30 * 24 * 3600.0
    # how often orphaned Ray actors (no attempt row owns them) are looked for
    orphan_check_interval_s: float = 30.0
    # how often the store is swept of checkpoints never published (ADR 0047), and how long
    # after a trial's attempt ended its unpublished checkpoint bytes are kept (a rank of a
    # lost node may still be finishing an upload it began)
    leftover_sweep_interval_s: float = 600.0
    leftover_grace_s: float = 600.0
    # half-life of the decayed usage that fair share orders tenants by
    usage_half_life_s: float = 24 * 3600.0
    # how often the duration estimates (run times of completed trials) are read again, and
    # how many similar completed trials an estimate needs
    estimates_refresh_s: float = 60.0
    estimate_min_samples: int = 3
    # each attempt's stored output, shared by its ranks (core/log_cap.py; admins set it)
    max_log_bytes_per_trial: int = DEFAULT_MAX_LOG_BYTES_PER_TRIAL

    def __post_init__(self) -> None:
        if not self.api_url.startswith(("http://", "https://")):
            raise ValueError(f"api_url must be an http(s) URL, got {self.api_url!r}")
        if self.leftover_sweep_interval_s <= 0 or self.leftover_grace_s < 0:
            raise ValueError("leftover_sweep_interval_s must be > 0 and leftover_grace_s >= 0")

    @property
    def limits(self) -> AttemptLimits:
        return AttemptLimits(
            placement_timeout_s=self.placement_timeout_s,
            stop_wait_s=self.stop_wait_s,
            cancel_grace_s=self.terminate_grace_s,
            exit_margin_s=self.exit_margin_s,
        )


@dataclass
class TickReport:
    polled: int = 0
    started: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    pending: int = 0
    # the verdict on each polled attempt (trial id -> verdict), in tick order
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    # what the sweep of unpublished checkpoints did, in a tick it ran (ADR 0047)
    leftovers: SweepReport | None = None


class ControlLoop:
    def __init__(
        self,
        uow: UnitOfWork,
        executor: Executor,
        store: ArtifactStore,
        policy: BasePolicy,
        config: LoopConfig,
        clock: Clock,
        hooks: TrialHooks | None = None,
        monitoring: MonitoringService | None = None,
        environments: EnvironmentService | None = None,
        trial_files: TrialFiles | None = None,
    ) -> None:
        self.uow = uow
        # builds the environments of specs that ask for packages, before placement (ADR 0026)
        self.environments = environments
        self._ready_environments: dict[int, EnvironmentReady] = {}  # trial -> its environment
        self.monitoring = monitoring  # node health, temperatures, cordon/drain (service/monitoring)
        self.hooks = hooks  # searches: pruning, pausing, warm starts (service/search.py)
        # an interactive session's secret, base URL and home (service/sessions.py wires it)
        self.session_env: Callable[[int], tuple[dict[str, str], str | None]] | None = None
        # called with an ended trial's id before its folder is removed (event files kept)
        self.keep_trial_files: Callable[[int], None] | None = None
        self.executor = executor
        self.store = store
        self.policy = policy
        self.config = config
        self.clock = clock
        self.limits = config.limits
        self._specs: dict[int, ExperimentSpec] = {}
        self._raw_specs: dict[int, dict[str, Any]] = {}
        self._context_keys: dict[int, str] = {}
        self.view = SchedulingView(
            policy,
            config.usage_half_life_s,
            config.estimates_refresh_s,
            config.estimate_min_samples,
        )
        # the active trials and their open attempts, kept from the numbered changes
        self.observed = ObservedTrials(self.view.resync_s)
        self._last_orphan_check = float("-inf")
        # checkpoints that never published: their bytes go once their trial stops writing
        self.leftovers = CheckpointLeftovers(uow, store, clock, config.leftover_grace_s)
        self._last_leftover_sweep = float("-inf")
        # attempt key -> rank -> where its log stands (see _poll_with_logs)
        self._log_sizes: dict[str, dict[int, LogPosition]] = {}
        self._rank_logs = RankLogs(store)
        # what trials write on their nodes, against their storage quotas (issue 24)
        self.write_quotas = WriteQuotas()
        self.traffic = TrafficMeter()  # network bytes per attempt and rank (issue 30)
        self.trial_files = trial_files

    @property
    def usage(self) -> DecayedUsage:
        """Each tenant's decayed usage, as fair share reads it."""
        return self.view.usage

    # ---------------------------------------------------------------- the tick
    def tick(self) -> TickReport:
        report = TickReport()
        self._release_orphans()
        with self.uow() as repo:
            # the columns an attempt is judged by, read for the trials changed since the last
            # tick (ADR 0025); the whole trial is read where an attempt ends
            active, attempts = self.observed.read(repo, self.clock())
            self._load_specs(repo, active)
            self.view.advance_usage(repo, active, attempts, self.clock())
        running: list[tuple[ActiveRecord, Attempt]] = []  # attempts whose ranks all run now
        ends: list[_Ending] = []  # attempts that end, their output drained
        for trial in active:
            report.polled += 1
            attempt = attempts.get(trial.id)
            verdict = self._observe(trial, attempt, ends)
            report.verdicts[trial.id] = verdict
            if isinstance(verdict, EndAttempt):
                report.ended.append(trial.id)
            elif isinstance(verdict, MarkRunning) and attempt is not None:
                running.append((trial, attempt))
        if ends:
            self._end_all(ends)
        if running:
            self._mark_running(running)
        self._hold_write_quotas({t.id: t.tenant for t in active if not t.state.is_terminal})
        self._record_traffic()
        if len(self._log_sizes) > len(attempts):  # ended attempts' counts
            polled = {a.key for a in attempts.values()}
            self._log_sizes = {k: v for k, v in self._log_sizes.items() if k in polled}
        if self.hooks is not None:
            self.hooks.tick()
        if self.monitoring is not None:
            self._watch_nodes(active, attempts)
        self._schedule(report)
        report.leftovers = self._sweep_leftovers()
        return report

    def _watch_nodes(self, active: Sequence[ActiveRecord], attempts: Mapping[int, Attempt]) -> None:
        """Refresh node health; preempt (by checkpoint) the trials of draining nodes."""
        assert self.monitoring is not None
        try:
            self.monitoring.refresh([n.node_id for n in self.executor.cluster_nodes()])
        except Exception:  # monitoring must never stop scheduling; the rules see the silence
            log.exception("monitoring refresh failed")
        draining = self.monitoring.draining_nodes()
        if not draining:
            return
        for trial in active:
            attempt = attempts.get(trial.id)
            if attempt is None or trial.state not in (TrialState.RUNNING, TrialState.SCHEDULED):
                continue
            nodes = draining.intersection(attempt.placement)
            if nodes:
                self._preempt(Preempt(trial.id, f"node {min(nodes)[:12]} is draining"))

    # ---------------------------------------------------------------- observing
    def _observe(
        self, trial: ActiveRecord, attempt: Attempt | None, ends: list[_Ending]
    ) -> Verdict:
        """Judge one active trial's attempt and carry the verdict out (an end: its output
        drained and added to ``ends``, written with the tick's other ends)."""
        if attempt is None:
            lost = EndAttempt(AttemptOutcome.LOST, "no attempt record")
            ends.append(self._ending(trial, None, lost))
            return lost
        status = self._poll_with_logs(trial, attempt)
        now = self.clock()
        facts = AttemptFacts(
            state=trial.state,
            cancel_requested=trial.cancel_requested,
            stop_reason=trial.stop_reason,
            created_at=attempt.created_at,
            started_at=attempt.started_at,
            stop_requested_at=attempt.stop_requested_at,
            terminate_sent_at=attempt.terminate_sent_at,
            grace_s=self._specs[trial.experiment_id].preemption.grace_s,
        )
        verdict = judge(facts, status, now, self.limits)
        if isinstance(verdict, EndAttempt):
            ends.append(self._ending(trial, attempt, verdict, status))
        elif isinstance(verdict, RequestStop):
            with self.uow() as repo:
                repo.update_attempt(attempt.id, AttemptUpdate(stop_requested_at=now))
                repo.add_event(trial.id, "stop", f"asked to stop: {verdict.reason}", now)
        elif isinstance(verdict, Terminate):
            self.executor.terminate(attempt.key, verdict.grace_s)
            with self.uow() as repo:
                repo.update_attempt(attempt.id, AttemptUpdate(terminate_sent_at=now))
                repo.add_event(
                    trial.id,
                    "sigterm",
                    f"SIGTERM to attempt {attempt.number} ({verdict.reason}); "
                    f"SIGKILL after {verdict.grace_s:.0f} s",
                    now,
                )
        return verdict

    def _mark_running(self, running: Sequence[tuple[ActiveRecord, Attempt]]) -> None:
        """The trials whose attempts run now (MarkRunning verdicts), written in one
        transaction: the busiest tick starts many."""
        now = self.clock()
        with self.uow() as repo:
            for trial, attempt in running:
                write_trial(
                    repo,
                    trial.id,
                    TrialUpdate(
                        state=TrialState.RUNNING,
                        started_at=trial.started_at or now,
                        pending_reason=None,
                    ),
                    current=trial.state,
                )
                repo.update_attempt(attempt.id, AttemptUpdate(started_at=now))
                repo.add_event(trial.id, "running", f"attempt {attempt.number} running", now)

    def _poll_with_logs(self, trial: Trial | ActiveRecord, attempt: Attempt) -> AttemptStatus:
        # where each rank's log stands (stored bytes, node offset): the loop is its only
        # writer, so it counts what it wrote; the store is asked once per attempt (at its first
        # poll by this process), not every tick (3,000 running trials: most of a tick went to
        # those stats). Each log is capped, its head and latest lines kept (trial_logs.py)
        world_size = len(attempt.placement)
        cap = LogCap.per_rank(self.config.max_log_bytes_per_trial, world_size)
        positions = self._log_sizes.get(attempt.key)
        if positions is None:
            positions = {
                rank: self._rank_logs.position(
                    log_key(trial.tenant, trial.id, attempt.number, rank), cap
                )
                for rank in range(world_size)
            }
            self._log_sizes[attempt.key] = positions
        status = self.executor.poll(attempt.key, {r: p.read for r, p in positions.items()})
        self.write_quotas.observe(trial.id, status)
        self.traffic.observe(trial.id, attempt.id, status)
        for rank_status in status.ranks:
            position = positions.get(rank_status.rank)
            if position is None:
                continue
            if rank_status.log_chunk or position.skipped:
                key = log_key(trial.tenant, trial.id, attempt.number, rank_status.rank)
                self._rank_logs.append(key, position, cap, rank_status.log_chunk)
            self._rank_logs.skip_behind(position, cap, rank_status.log_size)
        return status

    def _last_log_line(self, trial: Trial | ActiveRecord, attempt: Attempt, rank: int) -> str:
        """The last non-empty line of a rank's output (at most 300 characters), or ''."""
        key = log_key(trial.tenant, trial.id, attempt.number, rank)
        if not self.store.exists(key):
            return ""
        tail = self.store.read_range(key, max(0, self.store.size(key) - 4096))
        lines = [line.strip() for line in tail.decode(errors="replace").splitlines()]
        said = [line for line in lines if line]
        return said[-1][:300] if said else ""

    def _drain_logs(
        self, trial: Trial | ActiveRecord, attempt: Attempt, max_rounds: int = 64
    ) -> AttemptStatus:
        """Fetch the output that is left before the actors are released."""
        status = self._poll_with_logs(trial, attempt)
        for _ in range(max_rounds):
            if not any(r.log_chunk for r in status.ranks):
                break
            status = self._poll_with_logs(trial, attempt)
        return status

    def _end(
        self,
        record: Trial | ActiveRecord,
        attempt: Attempt | None,
        verdict: EndAttempt,
        status: AttemptStatus | None = None,
    ) -> None:
        """End one attempt as ``verdict`` says (see :meth:`_end_all`)."""
        self._end_all([self._ending(record, attempt, verdict, status)])

    def _ending(
        self,
        record: Trial | ActiveRecord,
        attempt: Attempt | None,
        verdict: EndAttempt,
        status: AttemptStatus | None = None,
    ) -> _Ending:
        """What ending the attempt writes: its ranks stopped where the verdict says so, their
        output drained, their exit codes, and what the failed rank said last."""
        exit_codes: tuple[int | None, ...] = ()
        detail = verdict.detail
        if attempt is not None:
            if verdict.stop_others:
                # the gang is broken or would not stop: end the ranks that still run
                self.executor.terminate(attempt.key, self.config.terminate_grace_s)
            final = self._drain_logs(record, attempt)
            ranks = final.ranks or (status.ranks if status else ())
            exit_codes = tuple(r.exit_code for r in ranks)
            failed = [r.rank for r in ranks if r.exit_code not in (0, None)]
            if verdict.outcome == AttemptOutcome.FAILED and failed:
                # what the script said last is most often why it failed: the rank the verdict
                # blames, not one that only says it was stopped after it
                blamed = verdict.rank if verdict.rank in failed else failed[0]
                said = self._last_log_line(record, attempt, blamed)
                detail = f"{detail}; rank {blamed} said: {said}" if said else detail
        return _Ending(record.id, attempt, verdict, detail, exit_codes)

    def _end_all(self, endings: Sequence[_Ending]) -> None:
        """Write the ends in one transaction (each moves its trial to its next state, read
        whole in it), then release the attempts' actors. Released only once the ends are
        committed: if the write fails, the next tick finds the attempts as they were and ends
        them again (their output is stored already)."""
        now = self.clock()
        with self.uow() as repo:
            ended = [e.trial_id for e in endings if self._write_end(repo, e, now)]
        for ending in endings:
            if ending.attempt is not None:
                self.executor.release(ending.attempt.key)
        if ended:
            self._discard_trial_files(ended)

    # ---------------------------------------------------------------- traffic
    def _record_traffic(self) -> None:
        """Write the network bytes that grew (one transaction every few seconds at most)."""
        now = self.clock()
        if not self.traffic.due(now):
            return
        try:
            with self.uow() as repo:
                self.traffic.flush(repo, now)
        except Exception:  # accounting never stops the loop; the next flush writes it
            log.exception("could not record the trials' network traffic")

    # ---------------------------------------------------------------- write quotas
    def _hold_write_quotas(self, tenants_of: Mapping[int, str]) -> None:
        """Write what the nodes measured of the trials' folders; stop (as a cancel does, with
        the reason) each trial over its trial's or its tenant's storage quota, its folder
        made read-only: it keeps what it wrote, and cannot write more while it stops."""
        if not self.write_quotas.changed(tenants_of):
            return  # most ticks: no transaction
        now = self.clock()
        with self.uow() as repo:
            overdrawn = self.write_quotas.overdrawn(repo, tenants_of)
            for trial_id, reason in overdrawn:
                repo.update_trial(trial_id, TrialUpdate(cancel_requested=True, stop_reason=reason))
                repo.add_event(trial_id, "quota", reason, now)
        for trial_id, reason in overdrawn:
            log.warning("trial %d: %s", trial_id, reason)
            if self.trial_files is not None:
                try:
                    self.trial_files.freeze_trial_files(trial_id)
                except Exception:
                    log.exception("could not make trial %d's folder read-only", trial_id)

    def _discard_trial_files(self, trial_ids: Sequence[int]) -> None:
        """Retention of ended trials' folders: removed, and no longer counted (what of them
        is kept, TensorBoard's event files, is kept first: ``keep_trial_files``)."""
        if self.trial_files is not None:
            for trial_id in trial_ids:
                if self.keep_trial_files is not None:
                    try:
                        self.keep_trial_files(trial_id)
                    except Exception:
                        log.exception("could not keep trial %d's event files", trial_id)
                try:
                    self.trial_files.discard_trial_files(trial_id)
                except Exception:
                    log.exception("could not remove trial %d's folder", trial_id)
        self.write_quotas.forget(trial_ids)

    def _write_end(self, repo: Repository, ending: _Ending, now: float) -> bool:
        """Write one end; True when the trial itself ended (a terminal state)."""
        attempt, outcome, detail = ending.attempt, ending.verdict.outcome, ending.detail
        trial = repo.get_trial(ending.trial_id)
        if trial is None:
            return False
        retry = ending.verdict.retry
        if (
            attempt is not None
            and outcome == AttemptOutcome.FAILED
            and retry
            and OOM_MARK not in detail
        ):
            # a failure that will always repeat is not retried (core/failures.py); running out
            # of memory has its own rule below (the same point, no progress in between)
            judged = judge_failed_attempt(repo, self.store, trial, attempt, ending.exit_codes)
            if judged is not None:
                retry = judged.retry
                detail = f"{detail}; {judged.note}" if judged.note else detail
        ran_s = held_s = 0.0
        num_slots = 0
        progress_s = trial.progress_s
        if attempt is not None:
            repo.update_attempt(
                attempt.id,
                AttemptUpdate(
                    outcome=outcome.value,
                    ended_at=now,
                    detail=detail,
                    exit_codes=ending.exit_codes,
                ),
            )
            if attempt.token_id is not None:
                repo.revoke_token(attempt.token_id)
            if outcome.ran:
                # run time counts from the processes' start (or placement, if they ended
                # before they were seen running); service from when the slots were held
                ran_s = max(0.0, now - (attempt.started_at or attempt.created_at))
                held_s = max(0.0, now - attempt.created_at)
                num_slots = attempt.num_slots
                saved = repo.checkpoint_times([trial.id]).get(trial.id)
                if saved is not None and saved.attempt == attempt.number:
                    began = attempt.started_at or attempt.created_at
                    progress_s = trial.progress_s + max(0.0, saved.last_at - began)
        number = attempt.number if attempt else trial.num_attempts
        repo.add_event(trial.id, outcome.value.lower(), f"attempt {number}: {detail}", now)
        spec = self._spec(repo, trial)
        latest = repo.list_checkpoints(trial.id)
        if retry and OOM_MARK in detail and attempt is not None:
            again = self._out_of_memory_again(repo, trial.id, attempt.number, detail)
            if again is not None:
                detail, retry = again, False
        transition = next_trial_state(
            trial.state,
            outcome,
            detail,
            num_restarts=trial.num_restarts,
            max_restarts=spec.max_restarts,
            resume_step=latest[-1].step if latest else None,
            retry=retry,
        )
        transition = self._steered(trial, transition)  # PRUNED or PAUSED where asked
        if transition.target == TrialState.COMPLETED:
            missing = failure_at_end(spec.searcher, trial.latest_metrics)
            if missing is not None:  # it never reported what the searcher needs
                transition = Transition(TrialState.FAILED, missing, None)
        queued = transition.target == TrialState.QUEUED
        write_trial(
            repo,
            trial.id,
            TrialUpdate(
                state=transition.target,
                message=transition.message,
                pending_reason=transition.pending_reason,
                queued_at=now if queued else KEEP,
                stop_reason=None if queued else KEEP,
                ended_at=now if transition.ended else KEEP,
                num_restarts=trial.num_restarts + 1 if transition.counts_restart else KEEP,
                run_time_s=trial.run_time_s + ran_s,
                attained_service=trial.attained_service + held_s * num_slots,
                progress_s=progress_s,
            ),
            current=trial.state,
        )
        refresh_experiment_state(repo, trial.experiment_id, now)
        if transition.target.is_terminal and trial.disk_bytes:
            repo.record_disk_bytes({trial.id: 0})  # its folders go now (_discard_trial_files)
        return transition.target.is_terminal

    @staticmethod
    def _out_of_memory_again(
        repo: Repository, trial_id: int, number: int, detail: str
    ) -> str | None:
        """The final message when attempt ``number`` ran out of memory where the one before did."""
        previous = [a for a in repo.list_attempts(trial_id) if a.number == number - 1]
        saved = repo.checkpoint_times([trial_id]).get(trial_id)
        return out_of_memory_again(
            detail,
            previous[0].detail if previous else None,
            checkpointed_since=saved is not None and saved.attempt == number,
        )

    def _steered(self, trial: Trial, transition: Transition) -> Transition:
        """A pruned trial ends PRUNED (not CANCELED), a paused one waits PAUSED (not QUEUED)."""
        if self.hooks is None:
            return transition
        target = self.hooks.state_after_stop(trial, transition.target)
        if target == transition.target:
            return transition
        if target == TrialState.PAUSED:
            note = f"{trial.stop_reason or 'paused'}; resume to queue it again"
            return replace(transition, target=target, message=note, pending_reason=note)
        return replace(transition, target=target)

    def _release_orphans(self) -> None:
        now = self.clock()
        if now - self._last_orphan_check < self.config.orphan_check_interval_s:
            return
        self._last_orphan_check = now
        live = set(self.executor.live_attempts())
        if not live:
            return
        with self.uow() as repo:
            active = repo.scheduling_records(ACTIVE_STATES)  # the ids are all it needs
            owned = {a.key for a in repo.open_attempts([t.id for t in active]).values()}
        for key in live - owned:
            log.warning("releasing orphaned attempt %s (no active trial owns it)", key)
            self.executor.terminate(key, 0)
            self.executor.release(key)

    def _sweep_leftovers(self) -> SweepReport | None:
        """Every ``leftover_sweep_interval_s``: delete checkpoints never published whose
        trial stopped writing (ADR 0047). A store that fails is logged, never fatal to the
        tick: the next interval tries again."""
        now = self.clock()
        if now - self._last_leftover_sweep < self.config.leftover_sweep_interval_s:
            return None
        self._last_leftover_sweep = now
        try:
            return self.leftovers.sweep()
        except Exception:
            log.exception("sweeping unpublished checkpoints failed")
            return None

    # ---------------------------------------------------------------- scheduling
    def _load_specs(
        self, repo: Repository, trials: Sequence[Trial | SchedulingRecord | ActiveRecord]
    ) -> None:
        """Parse the specs of experiments not seen yet, read in one query."""
        missing = {t.experiment_id for t in trials if t.experiment_id not in self._specs}
        for experiment_id, spec in repo.experiment_specs(sorted(missing)).items():
            self._specs[experiment_id] = ExperimentSpec.model_validate(spec)
            self._raw_specs[experiment_id] = spec

    def _spec(self, repo: Repository, trial: Trial | ActiveRecord) -> ExperimentSpec:
        spec = self._specs.get(trial.experiment_id)
        if spec is None:
            raw = repo.experiment_of(trial.id).spec
            spec = ExperimentSpec.model_validate(raw)
            self._specs[trial.experiment_id] = spec
            self._raw_specs[trial.experiment_id] = raw
        return spec

    def _schedule(self, report: TickReport) -> None:
        now = self.clock()
        with self.uow() as repo:
            # the scheduling columns of the trials changed since the last tick (ADR 0024):
            # the whole trial is read for the ones started
            reads = self.view.read(repo, now)
            self._load_specs(repo, reads.records)
            # no cyclic collection while the snapshot is built and decided on: its garbage
            # is collected after the decision, not in the middle of it (core.gcpause)
            with collection_paused():
                self.view.apply(reads, self._specs, now)
                snapshot = self.view.snapshot(
                    repo,
                    self._specs,
                    self.executor.cluster_nodes,
                    now,
                    self.monitoring.node_overlay() if self.monitoring is not None else None,
                )
        if snapshot is None:
            return
        by_id = self.view.records
        started_at = time.perf_counter()
        with collection_paused():
            decisions = list(self.policy.decide(snapshot))
        if self.monitoring is not None:
            self.monitoring.observe_decision(time.perf_counter() - started_at)
        # preempt first: the victims' checkpoints start while the rest is carried out
        for decision in decisions:
            if isinstance(decision, Preempt):
                self._preempt(decision)
        position = 0
        notes: list[tuple[int, str, int]] = []  # trial, pending reason, queue position
        started: list[SchedulingRecord] = []
        building: dict[int, str] = {}  # trials waiting for their environment: no slot held
        starts = self._with_environments([d for d in decisions if isinstance(d, Start)], building)
        for trial_id in self._start(starts):
            report.started.append(trial_id)
            started.append(by_id[trial_id])
        for trial_id, reason in building.items():
            report.pending += 1
            position += 1
            trial = by_id[trial_id]
            if trial.pending_reason != reason or trial.queue_position != position:
                notes.append((trial_id, reason, position))
        for decision in decisions:
            if isinstance(decision, Pending):
                report.pending += 1
                position += 1
                trial = by_id[decision.trial_id]
                if trial.pending_reason != decision.reason or trial.queue_position != position:
                    notes.append((trial.id, decision.reason, position))
        # the trials started hold their slots from now on, not from the next tick
        self.view.started(started, self._specs, now)
        if notes:
            # one statement per set of columns, one commit: a long queue's reasons are cheap
            with self.uow() as repo:
                repo.update_trials(
                    [(i, TrialUpdate(pending_reason=r, queue_position=p)) for i, r, p in notes]
                )
            self.view.noted(notes)

    def _with_environments(self, starts: Sequence[Start], building: dict[int, str]) -> list[Start]:
        """The starts whose trials can run now: those whose spec asks for no packages, and
        those whose environment is built. The others wait in the queue (their environment
        builds meanwhile, ``building`` gets why) or fail once (it did not build)."""
        ready: list[Start] = []
        failed: list[tuple[int, str]] = []
        for start in starts:
            experiment_id = self.view.records[start.trial_id].experiment_id
            spec = self._specs[experiment_id]
            if not spec.environment.wants_packages:
                ready.append(start)
                continue
            if self.environments is None:
                failed.append((start.trial_id, "this control plane builds no environments"))
                continue
            readiness = self.environments.prepare(
                experiment_id, spec, partial(self._context_of, experiment_id), start.placement
            )
            if isinstance(readiness, EnvironmentReady):
                self._ready_environments[start.trial_id] = readiness
                ready.append(start)
            elif isinstance(readiness, EnvironmentBuilding):
                building[start.trial_id] = readiness.reason
            elif isinstance(readiness, EnvironmentFailed):
                failed.append((start.trial_id, readiness.message))
        if failed:
            self._fail_queued(failed)
        return ready

    def _context_of(self, experiment_id: int) -> bytes | None:
        with self.uow() as repo:
            key = repo.context_key(experiment_id)
        return self.store.get(key) if key else None

    def _fail_queued(self, failed: Sequence[tuple[int, str]]) -> None:
        """Fail queued trials whose environment did not build: once, never restarted (another
        attempt would fail the same way), with the resolver's own message."""
        now = self.clock()
        with self.uow() as repo:
            for trial_id, message in failed:
                trial = repo.get_trial(trial_id)
                if trial is None or trial.state != TrialState.QUEUED:
                    continue
                text = f"its environment could not be built: {message}"
                write_trial(
                    repo,
                    trial_id,
                    TrialUpdate(
                        state=TrialState.FAILED,
                        message=text,
                        pending_reason=None,
                        queue_position=None,
                        ended_at=now,
                    ),
                    current=trial.state,
                )
                repo.add_event(trial_id, "environment", text, now)
                refresh_experiment_state(repo, trial.experiment_id, now)

    def _start(self, starts: Sequence[Start]) -> list[int]:
        """Record the next attempt of each trial started, in one transaction (a busy tick
        starts many), then launch each; the ids of the trials started. A trial no longer
        queued (cancelled or paused since this tick read it) is left as it is."""
        now = self.clock()
        with self.uow() as repo:
            made = [self._record_start(repo, s.trial_id, s.placement, now) for s in starts]
        self._ready_environments.clear()  # those of trials no longer queued
        launches = [m for m in made if m is not None]
        for launch in launches:
            self._launch(launch)
        return [launch.trial.id for launch in launches]

    def _record_start(
        self, repo: Repository, trial_id: int, placement: tuple[str, ...], now: float
    ) -> _Started | None:
        trial = repo.get_trial(trial_id)
        if trial is None or trial.state != TrialState.QUEUED:
            return None
        spec = self._spec(repo, trial)
        # an experiment's code does not change once stored: its key is read once
        context_key = self._context_keys.get(trial.experiment_id)
        if context_key is None:
            context_key = repo.context_key(trial.experiment_id)
            if context_key is not None:
                self._context_keys[trial.experiment_id] = context_key
        number = trial.num_attempts + 1
        key = attempt_key(trial.id, number)
        secret, token_hash, prefix = new_token()
        token = repo.add_token(
            token_hash,
            prefix,
            f"trial {trial.id} attempt {number}",
            now,
            trial_id=trial.id,
            expires_at=now + self.config.trial_token_ttl_s,
        )
        checkpoints = repo.list_checkpoints(trial.id)
        restore = max(checkpoints, key=lambda c: (c.step, c.id)) if checkpoints else None
        restore_id = restore.id if restore else None
        if restore_id is None and self.hooks is not None:
            restore_id = self.hooks.warm_start(trial)  # a PBT donor's or a clone's source
        attempt = repo.add_attempt(
            trial.id,
            number,
            key,
            placement,
            restore_id,
            token.id,
            now,
            num_slots=ResourceRequest.from_spec(spec.resources).num_slots,
        )
        started = write_trial(
            repo,
            trial.id,
            TrialUpdate(
                state=TrialState.SCHEDULED,
                num_attempts=number,
                pending_reason=None,
                queue_position=None,
                cancel_requested=False,
                stop_reason=None,
            ),
            current=trial.state,
        )
        where = ", ".join(sorted(set(placement)))
        repo.add_event(trial.id, "scheduled", f"attempt {number} placed on {where}", now)
        raw = self._raw_specs[trial.experiment_id]
        environment = self._ready_environments.pop(trial.id, None)
        if environment is not None:
            record = environment.record
            how = "built for it" if record.num_uses == 0 and record.num_builds else "cached"
            repo.add_event(
                trial.id,
                "environment",
                f"environment {(record.key or '')[:12]} ready ({how}; "
                f"{len(record.packages)} packages over the base)",
                now,
            )
        return _Started(started, attempt, spec, raw, context_key, secret, environment)

    def _launch(self, started: _Started) -> None:
        """Hand the attempt to the executor; one it cannot even begin ends now, saying why."""
        trial, attempt, spec, raw = started.trial, started.attempt, started.spec, started.raw_spec
        env: dict[str, Any] = dict(spec.environment.variables)
        env.update(
            {
                protocol.ENV_API_URL: self.config.api_url,
                protocol.ENV_TOKEN: started.secret,
                protocol.ENV_TRIAL_ID: str(trial.id),
                protocol.ENV_EXPERIMENT_ID: str(trial.experiment_id),
                protocol.ENV_ATTEMPT: str(attempt.number),
                protocol.ENV_HPARAMS: json.dumps(trial.hparams),
            }
        )
        if spec.searcher.kind != "single" and spec.searcher.metric:
            env[protocol.ENV_SEARCHER_METRIC] = spec.searcher.metric
        if attempt.restored_checkpoint_id is not None:
            env[protocol.ENV_RESTORE_CHECKPOINT] = str(attempt.restored_checkpoint_id)
        distributed = raw.get("distributed")
        if distributed:
            env[protocol.ENV_DISTRIBUTED] = json.dumps(distributed)
        model = raw.get("model") or {}
        if any(model.get(k) for k in ("init_from", "freeze", "reset", "grow")):
            env[protocol.ENV_MODEL] = json.dumps(model)
        distill = raw.get("distill")
        if distill:
            env[protocol.ENV_DISTILL] = json.dumps(distill)
        if raw.get("data"):  # the node fetches and mounts them (ray_executor/node_datasets.py)
            env["TRAINHUB_DATASETS"] = json.dumps(raw["data"])
        argv = tuple(spec.entrypoint_argv)
        if spec.federated is not None:  # a Flower server and its clients (ADR 0044)
            mounts = [(d.name, d.mount) for d in spec.data]
            env[FEDERATED_ENV] = launch_env(raw["federated"], mounts)
            argv = launch_argv(list(argv))
        home = None
        if raw.get("session") and self.session_env is not None:
            extra, home = self.session_env(trial.experiment_id)
            env.update(extra)
        context = self.store.get(started.context_key) if started.context_key else b""
        # where the attempt's start goes: the rank adds its marks (trainhub.core.startup)
        env[protocol.ENV_STARTUP_MARKS] = json.dumps({"launched_at": self.clock()})
        launch = AttemptLaunch(
            attempt_key=attempt.key,
            trial_id=trial.id,
            attempt=attempt.number,
            argv=argv,
            context_archive=context,
            env={k: str(v) for k, v in env.items()},
            placement=attempt.placement,
            gpus_per_worker=spec.resources.gpus_per_worker,
            cpus_per_worker=spec.resources.cpus_per_worker,
            memory_gb_per_worker=spec.resources.memory_gb_per_worker,
            pin_cpus=spec.resources.pin_cpus,
            strategy=spec.resources.placement,
            environment_dir=started.environment.path if started.environment else None,
            environment_key=started.environment.record.key if started.environment else None,
            home_key=home,
        )
        if started.environment is not None and self.environments is not None:
            self.environments.used(started.environment, attempt.placement)
        try:
            self.executor.launch(launch)
        except Exception as exc:  # the executor failed to even begin: end it now, say why
            log.exception("launching %s failed", attempt.key)
            cause = " ".join(str(exc).split()) or type(exc).__name__
            self._end(trial, attempt, EndAttempt(AttemptOutcome.LOST, launch_failed(cause)))

    def _preempt(self, decision: Preempt) -> None:
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(decision.trial_id)
            if trial is None or trial.state not in (TrialState.RUNNING, TrialState.SCHEDULED):
                return
            write_trial(
                repo,
                trial.id,
                TrialUpdate(state=TrialState.PREEMPTING, stop_reason=decision.reason),
                current=trial.state,
            )
            attempt = repo.open_attempt(trial.id)
            if attempt is not None:
                # should_stop() answers True from now on; SIGTERM follows after stop_wait_s
                repo.update_attempt(attempt.id, AttemptUpdate(stop_requested_at=now))
            repo.add_event(trial.id, "preempting", decision.reason, now)
