"""The control loop: one tick observes running attempts, then schedules queued trials.

It is the single writer of trial states after submission (cancel of a queued trial aside). Each
tick: poll every attempt the database says is active (logs are appended to the store, exits and
losses decide the next state), then hand a snapshot to the scheduling policy and carry out its
decisions. After a control-plane restart the same tick reconciles: attempts whose Ray actors are
gone are LOST, orphan actors nobody owns are released.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import (
    BasePolicy,
    Pending,
    Preempt,
    QueuedTrial,
    QueueIndex,
    RunningTrial,
    Snapshot,
    Start,
)
from trainhub.core.scheduling.nodetable import NodeTable
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import TenantShare
from trainhub.core.spec import ExperimentSpec, Priority
from trainhub.core.states import AttemptOutcome, TrialState
from trainhub.runtime import protocol
from trainhub.service.auth import new_token
from trainhub.service.clock import Clock
from trainhub.service.experiments import refresh_experiment_state
from trainhub.service.keys import attempt_key, log_key
from trainhub.service.ports import (
    ArtifactStore,
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    Executor,
    RankPhase,
)
from trainhub.service.records import Attempt, Trial
from trainhub.service.repository import Repository, UnitOfWork
from trainhub.service.search_ports import TrialHooks
from trainhub.service.usage import DecayedUsage

log = logging.getLogger(__name__)

ACTIVE_STATES = (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING)


@dataclass(frozen=True)
class LoopConfig:
    api_url: str
    placement_timeout_s: float = 300.0
    terminate_grace_s: float = 10.0
    trial_token_ttl_s: float = 30 * 24 * 3600.0
    # how often orphaned Ray actors (no attempt row owns them) are looked for
    orphan_check_interval_s: float = 30.0
    # half-life of the decayed usage that fair share orders tenants by
    usage_half_life_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if not self.api_url.startswith(("http://", "https://")):
            raise ValueError(f"api_url must be an http(s) URL, got {self.api_url!r}")


@dataclass
class TickReport:
    polled: int = 0
    started: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    pending: int = 0


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
    ) -> None:
        self.uow = uow
        self.hooks = hooks  # searches: pruning, pausing, warm starts (service/search.py)
        self.executor = executor
        self.store = store
        self.policy = policy
        self.config = config
        self.clock = clock
        self._specs: dict[int, ExperimentSpec] = {}
        # the policy's queue index, kept between ticks: a decision re-indexes only what changed
        self._queue_index = QueueIndex(policy.queue_order)
        self._queued: dict[int, QueuedTrial] = {}
        # the same for running trials and nodes: policy caches keyed by them stay warm
        self._running: dict[int, tuple[tuple[object, ...], RunningTrial]] = {}
        self._running_table = RunningTable()
        self._node_table = NodeTable(())
        self._last_orphan_check = float("-inf")
        self.usage = DecayedUsage(config.usage_half_life_s)

    # ---------------------------------------------------------------- the tick
    def tick(self) -> TickReport:
        report = TickReport()
        self._release_orphans()
        with self.uow() as repo:
            active = repo.trials_in_states(ACTIVE_STATES)
        for trial in active:
            report.polled += 1
            if self._observe(trial):
                report.ended.append(trial.id)
        if self.hooks is not None:
            self.hooks.tick()
        self._schedule(report)
        return report

    # ---------------------------------------------------------------- observing
    def _observe(self, trial: Trial) -> bool:
        """Poll one active trial's attempt; return True when the attempt ended."""
        with self.uow() as repo:
            attempt = repo.open_attempt(trial.id)
        if attempt is None:
            self._finish_attempt(trial, None, AttemptOutcome.LOST, "no attempt record")
            return True
        status = self._poll_with_logs(trial, attempt)
        now = self.clock()
        if trial.cancel_requested:
            self.executor.terminate(attempt.key, self.config.terminate_grace_s)
            self._drain_logs(trial, attempt)
            self._finish_attempt(trial, attempt, AttemptOutcome.KILLED, trial.stop_reason or "")
            return True
        if status.phase in (AttemptPhase.UNKNOWN, AttemptPhase.LOST):
            detail = status.detail or "the attempt's Ray actors are gone"
            self.executor.terminate(attempt.key, 0)
            self._finish_attempt(trial, attempt, AttemptOutcome.LOST, detail)
            return True
        if status.phase == AttemptPhase.PLACING:
            if now - attempt.created_at > self.config.placement_timeout_s:
                self._finish_attempt(
                    trial,
                    attempt,
                    AttemptOutcome.LOST,
                    f"placement not ready after {self.config.placement_timeout_s:.0f} s",
                )
                return True
            return False
        codes = [r.exit_code for r in status.ranks]
        failed = [
            r for r in status.ranks if r.phase == RankPhase.EXITED and r.exit_code not in (0, None)
        ]
        lost = [r for r in status.ranks if r.phase == RankPhase.LOST]
        if failed or lost:
            # one rank down means the gang is broken: end the others too
            self.executor.terminate(attempt.key, self.config.terminate_grace_s)
            self._drain_logs(trial, attempt)
            what = (
                f"rank {failed[0].rank} exited with code {failed[0].exit_code}"
                if failed
                else f"rank {lost[0].rank} was lost (actor or node died)"
            )
            outcome = AttemptOutcome.FAILED if failed else AttemptOutcome.LOST
            final = self.executor.poll(attempt.key, {})
            self._finish_attempt(
                trial,
                attempt,
                outcome,
                what,
                exit_codes=[r.exit_code for r in final.ranks] or codes,
            )
            return True
        if status.ranks and all(r.phase == RankPhase.EXITED for r in status.ranks):
            self._drain_logs(trial, attempt)
            outcome = (
                AttemptOutcome.PREEMPTED
                if trial.state == TrialState.PREEMPTING
                else AttemptOutcome.SUCCEEDED
            )
            self._finish_attempt(trial, attempt, outcome, "every rank exited 0", exit_codes=codes)
            return True
        if trial.state == TrialState.SCHEDULED and any(
            r.phase == RankPhase.RUNNING for r in status.ranks
        ):
            with self.uow() as repo:
                repo.set_trial_state(
                    trial.id,
                    TrialState.RUNNING,
                    started_at=trial.started_at or now,
                    pending_reason=None,
                )
                repo.update_attempt(attempt.id, started_at=now)
                repo.add_event(trial.id, "running", f"attempt {attempt.number} running", now)
        return False

    def _poll_with_logs(self, trial: Trial, attempt: Attempt) -> AttemptStatus:
        offsets = {
            rank: self.store.size(log_key(trial.tenant, trial.id, attempt.number, rank))
            for rank in range(len(attempt.placement))
        }
        status = self.executor.poll(attempt.key, offsets)
        for rank_status in status.ranks:
            if rank_status.log_chunk:
                key = log_key(trial.tenant, trial.id, attempt.number, rank_status.rank)
                self.store.write_at(key, offsets.get(rank_status.rank, 0), rank_status.log_chunk)
        return status

    def _drain_logs(self, trial: Trial, attempt: Attempt, max_rounds: int = 64) -> None:
        """Fetch the output that is left before the actors are released."""
        for _ in range(max_rounds):
            status = self._poll_with_logs(trial, attempt)
            if not any(r.log_chunk for r in status.ranks):
                return

    def _finish_attempt(
        self,
        trial: Trial,
        attempt: Attempt | None,
        outcome: AttemptOutcome,
        detail: str,
        exit_codes: list[int | None] | None = None,
    ) -> None:
        now = self.clock()
        if attempt is not None:
            self.executor.release(attempt.key)
        with self.uow() as repo:
            if attempt is not None:
                repo.update_attempt(
                    attempt.id,
                    outcome=outcome.value,
                    ended_at=now,
                    detail=detail,
                    exit_codes=exit_codes or [],
                )
                if attempt.token_id is not None:
                    repo.revoke_token(attempt.token_id)
            number = attempt.number if attempt else trial.num_attempts
            repo.add_event(trial.id, outcome.value.lower(), f"attempt {number}: {detail}", now)
            self._next_state(repo, trial, outcome, detail, now)
            refresh_experiment_state(repo, trial.experiment_id, now)

    def _next_state(
        self, repo: Repository, trial: Trial, outcome: AttemptOutcome, detail: str, now: float
    ) -> None:
        if outcome == AttemptOutcome.KILLED:
            state = self._after_stop(trial, TrialState.CANCELED)  # PRUNED when pruned
            repo.set_trial_state(trial.id, state, ended_at=now, message=detail, pending_reason=None)
            return
        if outcome == AttemptOutcome.SUCCEEDED:
            repo.set_trial_state(
                trial.id, TrialState.COMPLETED, ended_at=now, message=None, pending_reason=None
            )
            return
        if outcome == AttemptOutcome.PREEMPTED and (
            self._after_stop(trial, TrialState.QUEUED) == TrialState.PAUSED
        ):
            reason = f"{trial.stop_reason or 'paused'}; resume to queue it again"
            repo.set_trial_state(
                trial.id, TrialState.PAUSED, stop_reason=None, pending_reason=reason
            )
            return
        if outcome == AttemptOutcome.PREEMPTED:
            repo.set_trial_state(
                trial.id,
                TrialState.QUEUED,
                queued_at=now,
                stop_reason=None,
                pending_reason=f"preempted ({trial.stop_reason or detail}); resumes from its "
                "latest checkpoint",
            )
            return
        spec = self._spec(repo, trial)
        if trial.num_restarts < spec.max_restarts:
            restarts = trial.num_restarts + 1
            latest = repo.list_checkpoints(trial.id)
            resume = f"checkpoint at step {latest[-1].step}" if latest else "the beginning"
            repo.set_trial_state(
                trial.id,
                TrialState.QUEUED,
                queued_at=now,
                num_restarts=restarts,
                message=detail,
                pending_reason=f"restart {restarts}/{spec.max_restarts} after: {detail}; "
                f"resumes from {resume}",
            )
            return
        repo.set_trial_state(
            trial.id,
            TrialState.FAILED,
            ended_at=now,
            pending_reason=None,
            message=f"{detail} (no restarts left of max_restarts={spec.max_restarts})",
        )

    def _after_stop(self, trial: Trial, default: TrialState) -> TrialState:
        return default if self.hooks is None else self.hooks.state_after_stop(trial, default)

    def _release_orphans(self) -> None:
        now = self.clock()
        if now - self._last_orphan_check < self.config.orphan_check_interval_s:
            return
        self._last_orphan_check = now
        live = set(self.executor.live_attempts())
        if not live:
            return
        with self.uow() as repo:
            active = repo.trials_in_states(ACTIVE_STATES)
            owned = {a.key for a in repo.open_attempts([t.id for t in active]).values()}
        for key in live - owned:
            log.warning("releasing orphaned attempt %s (no active trial owns it)", key)
            self.executor.terminate(key, 0)
            self.executor.release(key)

    # ---------------------------------------------------------------- scheduling
    def _spec(self, repo: Repository, trial: Trial) -> ExperimentSpec:
        spec = self._specs.get(trial.experiment_id)
        if spec is None:
            spec = ExperimentSpec.model_validate(repo.experiment_of(trial.id).spec)
            self._specs[trial.experiment_id] = spec
        return spec

    def _queued_trial(self, repo: Repository, trial: Trial) -> QueuedTrial:
        """The policy's view of a queued trial; the same object while its row is unchanged."""
        known = self._queued.get(trial.id)
        if (
            known is not None
            and known.priority == trial.priority
            and known.queued_at == trial.queued_at
            and known.tenant == trial.tenant
        ):
            return known
        made = QueuedTrial(
            trial_id=trial.id,
            tenant=trial.tenant,
            request=ResourceRequest.from_spec(self._spec(repo, trial).resources),
            priority=Priority(trial.priority),
            queued_at=trial.queued_at,
            submitted_at=trial.submitted_at,
        )
        self._queued[trial.id] = made
        return made

    def _running_trial(
        self, repo: Repository, trial: Trial, attempt: Attempt, preemptions: int
    ) -> RunningTrial:
        """The policy's view of an active trial; the same object while nothing it shows changed."""
        preempting = trial.state == TrialState.PREEMPTING
        started_at = attempt.started_at or attempt.created_at
        fingerprint = (attempt.id, started_at, preempting, preemptions, trial.priority)
        known = self._running.get(trial.id)
        if known is not None and known[0] == fingerprint:
            return known[1]
        made = RunningTrial(
            trial_id=trial.id,
            tenant=trial.tenant,
            request=ResourceRequest.from_spec(self._spec(repo, trial).resources),
            placement=attempt.placement,
            priority=Priority(trial.priority),
            started_at=started_at,
            submitted_at=trial.submitted_at,
            preempting=preempting,
            num_preemptions=preemptions,
        )
        self._running[trial.id] = (fingerprint, made)
        return made

    def _schedule(self, report: TickReport) -> None:
        now = self.clock()
        with self.uow() as repo:
            if not self.usage.initialized:
                horizon = now - 10 * self.config.usage_half_life_s
                self.usage.rebuild(repo.attempt_usage(horizon), now)
            queued = repo.trials_in_states([TrialState.QUEUED])
            active = repo.trials_in_states(ACTIVE_STATES)
            preemptions = repo.count_outcomes(
                [t.id for t in active], AttemptOutcome.PREEMPTED.value
            )
            running: list[RunningTrial] = []
            held: dict[str, float] = {}
            attempts = repo.open_attempts([t.id for t in active])
            for trial in active:
                attempt = attempts.get(trial.id)
                if attempt is None:
                    continue
                view = self._running_trial(repo, trial, attempt, preemptions.get(trial.id, 0))
                held[trial.tenant] = held.get(trial.tenant, 0.0) + view.request.num_slots
                running.append(view)
            self._running = {r.trial_id: (self._running[r.trial_id][0], r) for r in running}
            tenant_usage = self.usage.advance(held, now)
            waiting = [self._queued_trial(repo, t) for t in queued]
            self._queued = {q.trial_id: q for q in waiting}
            if not waiting:
                return
            queue = self._queue_index.sync(waiting)
            tenants = {
                t.name: TenantShare(t.guaranteed_slots, t.limit_slots, t.weight)
                for t in repo.list_tenants()
            }
        nodes = self._free_capacity(self.executor.cluster_nodes(), running)
        self._node_table = self._node_table.synced(nodes)
        self._running_table = self._running_table.synced(running)
        snapshot = Snapshot(
            now=now,
            nodes=self._node_table,
            queue=queue,
            running=self._running_table,
            tenants=tenants,
            tenant_usage=tenant_usage,
        )
        by_id = {t.id: t for t in queued}
        decisions = list(self.policy.decide(snapshot))
        # preempt first: the victims' checkpoints start while the rest is carried out
        for decision in decisions:
            if isinstance(decision, Preempt):
                self._preempt(decision)
        position = 0
        for decision in decisions:
            if isinstance(decision, Start):
                self._start(by_id[decision.trial_id], decision.placement)
                report.started.append(decision.trial_id)
            elif isinstance(decision, Pending):
                report.pending += 1
                position += 1
                trial = by_id[decision.trial_id]
                if trial.pending_reason != decision.reason or trial.queue_position != position:
                    with self.uow() as repo:
                        repo.update_trial(
                            trial.id, pending_reason=decision.reason, queue_position=position
                        )

    @staticmethod
    def _free_capacity(nodes: list[Node], running: list[RunningTrial]) -> tuple[Node, ...]:
        """Free capacity by our own books: totals minus what active trials hold.

        Ray's own free counts lag behind placement groups still being created, and trials of
        this control plane are the only users of the cluster's training resources.
        """
        gpus: dict[str, int] = {}
        cpus: dict[str, float] = {}
        for trial in running:
            request = trial.request
            for node_id in trial.placement:
                gpus[node_id] = gpus.get(node_id, 0) + request.gpus_per_worker
                cpus[node_id] = cpus.get(node_id, 0.0) + request.cpus_per_worker
        return tuple(
            replace(
                n,
                free_gpus=n.total_gpus - gpus.get(n.node_id, 0),
                free_cpus=n.total_cpus - cpus.get(n.node_id, 0.0),
            )
            for n in nodes
        )

    def _start(self, trial: Trial, placement: tuple[str, ...]) -> None:
        now = self.clock()
        with self.uow() as repo:
            spec = self._spec(repo, trial)
            experiment = repo.experiment_of(trial.id)
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
            repo.set_trial_state(
                trial.id,
                TrialState.SCHEDULED,
                num_attempts=number,
                pending_reason=None,
                queue_position=None,
                cancel_requested=False,
                stop_reason=None,
            )
            where = ", ".join(sorted(set(placement)))
            repo.add_event(trial.id, "scheduled", f"attempt {number} placed on {where}", now)
        env: dict[str, Any] = dict(spec.environment.variables)
        env.update(
            {
                protocol.ENV_API_URL: self.config.api_url,
                protocol.ENV_TOKEN: secret,
                protocol.ENV_TRIAL_ID: str(trial.id),
                protocol.ENV_EXPERIMENT_ID: str(trial.experiment_id),
                protocol.ENV_ATTEMPT: str(number),
                protocol.ENV_HPARAMS: json.dumps(trial.hparams),
            }
        )
        if restore_id is not None:
            env[protocol.ENV_RESTORE_CHECKPOINT] = str(restore_id)
        distributed = experiment.spec.get("distributed")
        if distributed:
            env[protocol.ENV_DISTRIBUTED] = json.dumps(distributed)
        context = self.store.get(experiment.context_key) if experiment.context_key else b""
        launch = AttemptLaunch(
            attempt_key=key,
            trial_id=trial.id,
            attempt=number,
            argv=tuple(spec.entrypoint_argv),
            context_archive=context,
            env={k: str(v) for k, v in env.items()},
            placement=placement,
            gpus_per_worker=spec.resources.gpus_per_worker,
            cpus_per_worker=spec.resources.cpus_per_worker,
            memory_gb_per_worker=spec.resources.memory_gb_per_worker,
            strategy=spec.resources.placement,
        )
        try:
            self.executor.launch(launch)
        except Exception as exc:  # the executor failed to even begin: requeue, say why
            log.exception("launching %s failed", key)
            refreshed = self._reload(trial.id)
            self._finish_attempt(refreshed, attempt, AttemptOutcome.LOST, f"launch failed: {exc}")

    def _reload(self, trial_id: int) -> Trial:
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
        assert trial is not None
        return trial

    def _preempt(self, decision: Preempt) -> None:
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(decision.trial_id)
            if trial is None or trial.state not in (TrialState.RUNNING, TrialState.SCHEDULED):
                return
            repo.set_trial_state(trial.id, TrialState.PREEMPTING, stop_reason=decision.reason)
            repo.add_event(trial.id, "preempting", decision.reason, now)
