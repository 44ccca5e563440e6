"""The search tick: makes the trials of search experiments and stops the poor ones early.

The control loop calls :meth:`SearchService.tick` once per tick, before it schedules. For every
running search it:

1. reports each live trial's new values of the searcher's metric to the backend (Optuna) and asks
   the pruner about it; a pruned trial is asked to stop (``should_stop()`` with the reason) and
   ends PRUNED when its processes have exited;
2. tells the backend how ended trials ended (COMPLETED: its best value; PRUNED; FAILED or
   CANCELED: failed, after ``max_restarts`` are used up);
3. for PBT, carries out exploit/explore decisions (``core.pbt``);
4. asks the backend for new hyperparameters while fewer than ``max_concurrent_trials`` of its
   trials are unfinished and fewer than ``max_trials`` exist, and adds them as ordinary QUEUED
   trials: the fair scheduler places them like any other.

Nothing is lost across a control-plane restart: every step is recorded before the next one
starts, and repeating a step is harmless (a re-report of a step is ignored, telling an ended
trial again does nothing). An Optuna trial asked just before a crash, with no trial row yet, is
adopted by the next tick rather than asked again, so no point is sampled twice.

It also implements the control loop's hooks (:class:`SearchService` is a ``LoopHooks``): which
state a stopped trial ends in (PRUNED, PAUSED) and which checkpoint a trial without one of its
own warm-starts from (PBT donors, clones).
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainhub.core import pbt
from trainhub.core.search_space import (
    CategoricalParam,
    Distribution,
    FloatParam,
    IntParam,
    Scalar,
    SearchSpace,
)
from trainhub.core.searcher_metric import trial_warning
from trainhub.core.spec import ExperimentSpec
from trainhub.core.states import LEGAL_TRANSITIONS, ExperimentState, TrialState
from trainhub.service.artifact_sets import copy_set
from trainhub.service.clock import Clock
from trainhub.service.experiments import refresh_experiment_state
from trainhub.service.keys import checkpoint_key, checkpoint_set_key, is_checkpoint_set
from trainhub.service.ports import ArtifactStore
from trainhub.service.records import Trial, TrialUpdate
from trainhub.service.search_ports import (
    AskedTrial,
    SearchBackend,
    SearchRecord,
    SearchState,
    SearchTx,
    SearchUnitOfWork,
    SearchUpdate,
    SteeredTrial,
    SteeredUpdate,
    StopIntent,
    StudyConfig,
    TellState,
)
from trainhub.service.trial_writes import write_trial

log = logging.getLogger(__name__)
LIVE_SEARCH_STATES = (SearchState.RUNNING, SearchState.PAUSED)


def study_config(experiment_id: int, spec: ExperimentSpec) -> StudyConfig:
    searcher = spec.searcher
    space = spec.search_space
    return StudyConfig(
        name=f"trainhub-experiment-{experiment_id}",
        direction="maximize" if searcher.mode == "max" else "minimize",
        sampler=searcher.sampler_name,
        pruner=searcher.pruner_name,
        seed=searcher.seed,
        min_budget=searcher.budget.min,
        max_budget=searcher.budget.max,
        reduction_factor=searcher.reduction_factor,
        grid=space.grid() if searcher.sampler_name == "grid" else None,
    )


def is_better(value: float, than: float | None, mode: str) -> bool:
    return than is None or (value > than if mode == "max" else value < than)


class _FixedSuggest:
    """Replays recorded params through the space; raises KeyError where one is missing."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def suggest_float(self, param: FloatParam) -> float:
        return float(self.params[param.name])

    def suggest_int(self, param: IntParam) -> int:
        return int(self.params[param.name])

    def suggest_categorical(self, param: CategoricalParam) -> Scalar:
        value: Scalar = self.params[param.name]
        return value


@dataclass
class SearchTickReport:
    created: list[int] = field(default_factory=list)
    pruned: list[int] = field(default_factory=list)
    told: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)  # experiments whose search ended


@dataclass
class _View:
    """What one tick reads about one search, in one transaction."""

    search: SearchRecord
    spec: ExperimentSpec
    experiment_state: ExperimentState
    trials: dict[int, Trial]
    links: dict[int, SteeredTrial]


class SearchService:
    def __init__(
        self,
        uow: SearchUnitOfWork,
        backend: SearchBackend,
        store: ArtifactStore,
        clock: Clock,
        wake_scheduler: Callable[[], None] = lambda: None,
    ) -> None:
        self.uow = uow
        self.backend = backend
        self.store = store
        self.clock = clock
        self.wake_scheduler = wake_scheduler
        self._is_search: dict[int, bool] = {}  # experiment id -> whether its spec is a search
        self._specs: dict[int, ExperimentSpec] = {}
        # the tick (loop thread) and observe_trial (request threads) judge one trial's new
        # values one at a time, each reading the trial's link afresh under the lock
        self._observe_lock = threading.Lock()

    # ---------------------------------------------------------------- the tick
    def tick(self) -> SearchTickReport:
        report = SearchTickReport()
        with self.uow() as tx:
            self._discover(tx)
            searches = tx.search.searches_in_states(LIVE_SEARCH_STATES)
        for search in searches:
            try:
                self._tick_search(search.experiment_id, report)
            except Exception:  # one broken search must not stop the others
                log.exception("search tick of experiment %s failed", search.experiment_id)
        return report

    def _spec(self, experiment_id: int, raw: dict[str, Any]) -> ExperimentSpec:
        spec = self._specs.get(experiment_id)
        if spec is None:
            spec = ExperimentSpec.model_validate(raw)
            self._specs[experiment_id] = spec
        return spec

    def _discover(self, tx: SearchTx) -> None:
        """Give every new search experiment its search row (submit only wrote the experiment)."""
        experiments, _ = tx.repo.list_experiments(None, ExperimentState.ACTIVE, limit=10_000)
        now = self.clock()
        for experiment in experiments:
            known = self._is_search.get(experiment.id)
            if known is False:
                continue
            spec = self._spec(experiment.id, experiment.spec)
            if spec.searcher.kind == "single":
                self._is_search[experiment.id] = False
                continue
            self._is_search[experiment.id] = True
            if known is None:
                limit = spec.searcher.trial_limit(spec.search_space)
                concurrent = (
                    spec.searcher.population
                    if spec.searcher.kind == "pbt"
                    else spec.searcher.max_concurrent_trials
                )
                tx.search.ensure_search(experiment.id, limit, concurrent, now)

    def _read(self, experiment_id: int) -> _View | None:
        with self.uow() as tx:
            search = tx.search.get_search(experiment_id)
            experiment = tx.repo.get_experiment(experiment_id)
            if search is None or experiment is None:
                return None
            return _View(
                search,
                self._spec(experiment_id, experiment.spec),
                experiment.state,
                {t.id: t for t in tx.repo.list_trials(experiment_id)},
                {s.trial_id: s for s in tx.search.list_steered(experiment_id)},
            )

    def _tick_search(self, experiment_id: int, report: SearchTickReport) -> None:
        view = self._read(experiment_id)
        if view is None:
            return
        study = study_config(experiment_id, view.spec)
        self._observe_metrics(view, study, report)
        self._tell_ended(view, study, report)
        if view.spec.searcher.kind == "pbt":
            self._pbt_step(view, report)
        view = self._read(experiment_id)
        assert view is not None
        canceled = view.experiment_state == ExperimentState.CANCELED
        if view.search.state == SearchState.RUNNING and not canceled:
            self._fill(view, study, report)
            view = self._read(experiment_id)
            assert view is not None
        self._maybe_finish(view, study, report)

    # ---------------------------------------------------------------- metrics and pruning
    def _observe_metrics(self, view: _View, study: StudyConfig, report: SearchTickReport) -> None:
        for trial_id, link in view.links.items():
            trial = view.trials.get(trial_id)
            if trial is None or link.told or trial.state.is_terminal:
                continue
            self._observe_trial(trial_id, view.spec, study, report)
            if link.reported_step < 0 and view.spec.searcher.requires_metric:
                self._check_metric_reported(trial_id, view.spec)

    def _check_metric_reported(self, trial_id: int, spec: ExperimentSpec) -> None:
        """Fail a trial that certainly does not report the searcher metric (a typo of it,
        past the first rung) when the spec requires it (``searcher.require_metric``)."""
        searcher = spec.searcher
        with self.uow() as tx:
            link = tx.search.get_steered(trial_id)
            trial = tx.repo.get_trial(trial_id)
            if (
                link is None
                or trial is None
                or link.reported_step >= 0
                or link.stop_intent is not None
                or trial.state != TrialState.RUNNING
                or trial.cancel_requested
            ):
                return
            step = trial.latest_metrics.get("step")
            warning = trial_warning(
                searcher.metric,
                trial.latest_metrics,
                latest_step=step if isinstance(step, int) else None,
                first_rung=searcher.budget.min,
            )
            if warning is not None and warning.certain:
                self._request_stop(tx, trial, StopIntent.FAIL, warning.message)

    def observe_trial(self, trial_id: int) -> list[int]:
        """Judge a trial's new values of the searcher metric now (the metrics route calls it
        after storing a report, so a prune decided on that report rides on its reply, instead
        of waiting for the next tick). Returns ``[trial_id]`` if it was pruned, else ``[]``."""
        with self.uow() as tx:
            link = tx.search.get_steered(trial_id)
            if link is None or link.told:
                return []
            experiment = tx.repo.get_experiment(link.experiment_id)
        if experiment is None:
            return []
        spec = self._spec(experiment.id, experiment.spec)
        report = SearchTickReport()
        self._observe_trial(trial_id, spec, study_config(experiment.id, spec), report)
        return report.pruned

    def _observe_trial(
        self, trial_id: int, spec: ExperimentSpec, study: StudyConfig, report: SearchTickReport
    ) -> None:
        """Report a trial's values since the last look to the backend and ask the pruner."""
        metric = spec.searcher.metric
        mode = spec.searcher.mode
        prunes = spec.searcher.kind == "search" and study.pruner != "none"
        assert metric is not None
        with self._observe_lock:
            with self.uow() as tx:
                link = tx.search.get_steered(trial_id)
                trial = tx.repo.get_trial(trial_id)
                if link is None or trial is None or link.told or trial.state.is_terminal:
                    return
                new = tx.repo.list_metrics(trial_id, after_step=link.reported_step)
            points = [
                (p.step, float(p.values[metric]))
                for p in new
                if isinstance(p.values.get(metric), int | float)
                and math.isfinite(float(p.values[metric]))
            ]
            if not points:
                return
            if link.backend_id is not None:
                self.backend.report(study, link.backend_id, points)
            best = link.best_value
            for _, value in points:
                if is_better(value, best, mode):
                    best = value
            last_step, last_value = points[-1]
            stop: str | None = None
            # a trial that trained its whole budget has nothing left to save: it completes
            # (Optuna's successive halving has a rung at the budget's maximum and would prune it)
            done = study.max_budget is not None and last_step >= study.max_budget
            if (
                prunes
                and not done
                and link.backend_id is not None
                and trial.state == TrialState.RUNNING
                and not trial.cancel_requested
                and link.stop_intent is None
                and self.backend.should_prune(study, link.backend_id)
            ):
                stop = (
                    f"pruned by the {study.pruner} pruner: {metric}={last_value:.4g} at step "
                    f"{last_step} is not among the best of the trials at that step"
                )
            with self.uow() as tx:
                tx.search.update_steered(
                    trial_id,
                    SteeredUpdate(
                        reported_step=last_step,
                        best_value=best,
                        extra={**link.extra, "score": last_value, "step": last_step},
                    ),
                )
                if stop is not None:
                    self._request_stop(tx, trial, StopIntent.PRUNE, stop)
                    report.pruned.append(trial_id)

    def _request_stop(self, tx: SearchTx, trial: Trial, intent: StopIntent, why: str) -> None:
        """Ask a live trial to stop; the control loop ends it (PRUNED) once it has exited."""
        now = self.clock()
        tx.search.update_steered(trial.id, SteeredUpdate(stop_intent=intent, stop_detail=why))
        if trial.state in (TrialState.QUEUED, TrialState.PAUSED):
            update = TrialUpdate(
                state=TrialState.CANCELED, ended_at=now, pending_reason=None, message=why
            )
            write_trial(tx.repo, trial.id, update, current=trial.state)
        else:  # as a cancel: should_stop(), then SIGTERM; the loop ends it PRUNED
            tx.repo.update_trial(trial.id, TrialUpdate(cancel_requested=True, stop_reason=why))
        tx.repo.add_event(trial.id, intent.value, why, now)

    # ---------------------------------------------------------------- telling the backend
    def _tell_ended(self, view: _View, study: StudyConfig, report: SearchTickReport) -> None:
        for trial_id, link in view.links.items():
            trial = view.trials.get(trial_id)
            if trial is None or link.told or not trial.state.is_terminal:
                continue
            if link.backend_id is not None:
                if trial.state == TrialState.COMPLETED and link.best_value is not None:
                    state = TellState.COMPLETE
                elif trial.state == TrialState.PRUNED:
                    state = TellState.PRUNED
                else:
                    state = TellState.FAIL
                self.backend.tell(study, link.backend_id, state, link.best_value)
            with self.uow() as tx:
                tx.search.update_steered(trial_id, SteeredUpdate(told=True))
            report.told.append(trial_id)

    # ---------------------------------------------------------------- making trials
    def _fill(self, view: _View, study: StudyConfig, report: SearchTickReport) -> None:
        search = view.search
        if _metric_missing(view):
            return  # every trial runs the same script: more would fail the same way
        live = sum(1 for t in view.trials.values() if not t.state.is_terminal)
        made = len(view.links)
        if view.spec.searcher.kind == "pbt":
            # the first population; later members come only from exploit decisions
            missing = min(search.max_trials, view.spec.searcher.population) - made
            room = min(missing, search.max_concurrent_trials - live)
            if room > 0:
                rng = self._rng(view)
                space = view.spec.search_space
                batch = [space.sample(pbt.RandomSuggest(rng)) for _ in range(room)]
                with self.uow() as tx:
                    for params in batch:
                        report.created.append(self._add_trial(tx, view, params, None).trial_id)
                    tx.search.update_search(
                        search.experiment_id, SearchUpdate(rng_state=search.rng_state + 1)
                    )
            return
        if live >= search.max_concurrent_trials or made >= search.max_trials:
            return  # no room: do not even ask the backend what is pending
        linked = {link.backend_id for link in view.links.values()}
        orphans = [a for a in self.backend.pending(study) if a.backend_id not in linked]
        space = view.spec.search_space
        while live < search.max_concurrent_trials and made < search.max_trials:
            asked = self._adopt(orphans, study, space)
            if asked is None:
                if self.backend.is_exhausted(study):
                    break
                asked = self.backend.ask(study, space)
            with self.uow() as tx:
                link = self._add_trial(tx, view, asked.params, asked)
            report.created.append(link.trial_id)
            live += 1
            made += 1
        for orphan in orphans:  # asked before a crash but over the limits now
            self.backend.tell(study, orphan.backend_id, TellState.FAIL, None)

    def _adopt(
        self, orphans: list[AskedTrial], study: StudyConfig, space: SearchSpace
    ) -> AskedTrial | None:
        while orphans:
            orphan = orphans.pop(0)
            try:
                params = space.sample(_FixedSuggest(orphan.params))
            except KeyError:  # the crash came before every value was suggested
                self.backend.tell(study, orphan.backend_id, TellState.FAIL, None)
                continue
            return AskedTrial(orphan.backend_id, orphan.number, params)
        return None

    def _add_trial(
        self,
        tx: SearchTx,
        view: _View,
        params: dict[str, Any],
        asked: AskedTrial | None,
        parent: int | None = None,
        warm_start: int | None = None,
        due_step: int | None = None,
        why: str = "",
    ) -> SteeredTrial:
        now = self.clock()
        experiment_id = view.search.experiment_id
        trial = tx.repo.add_trial(experiment_id, params, view.spec.priority, now)
        searcher = view.spec.searcher
        what = (
            f"sampled by the {searcher.sampler_name} sampler (Optuna trial {asked.number})"
            if asked is not None
            else why or "sampled at random for the first PBT population"
        )
        tx.repo.add_event(trial.id, "submitted", what, now)
        link = tx.search.add_steered(
            SteeredTrial(
                trial_id=trial.id,
                experiment_id=experiment_id,
                backend_id=asked.backend_id if asked else None,
                number=asked.number if asked else None,
                warm_start_checkpoint_id=warm_start,
                parent_trial_id=parent,
                due_step=due_step if due_step is not None else searcher.perturbation_interval,
            )
        )
        refresh_experiment_state(tx.repo, experiment_id, now)
        return link

    # ---------------------------------------------------------------- PBT
    def _rng(self, view: _View) -> random.Random:
        seed = view.spec.searcher.seed or 0
        return random.Random(f"{seed}-{view.search.experiment_id}-{view.search.rng_state}")

    def _pbt_step(self, view: _View, report: SearchTickReport) -> None:
        searcher = view.spec.searcher
        members: list[pbt.Member] = []
        with self.uow() as tx:
            for trial_id, link in view.links.items():
                trial = view.trials[trial_id]
                if trial.state != TrialState.RUNNING or link.stop_intent is not None:
                    continue
                checkpoints = tx.repo.list_checkpoints(trial_id)
                score = link.extra.get("score")
                members.append(
                    pbt.Member(
                        trial_id,
                        trial.hparams,
                        float(score) if score is not None else None,
                        int(link.extra.get("step", -1)),
                        checkpoints[-1].id if checkpoints else None,
                        link.due_step,
                    )
                )
        space = view.spec.search_space
        mutable: tuple[Distribution, ...] = (
            SearchSpace(tuple(_parsed_mutations(searcher.mutations))).distributions
            if searcher.mutations
            else space.distributions
        )
        config = pbt.PbtConfig(
            mode=searcher.mode,
            quantile=searcher.quantile,
            interval=searcher.perturbation_interval,
            resample_probability=searcher.resample_probability,
            factors=searcher.perturbation_factors,
            mutable=mutable,
        )
        rng = self._rng(view)
        decisions = pbt.decide(members, config, rng)
        if not decisions:
            return
        made = len(view.links)
        with self.uow() as tx:
            for decision in decisions:
                if isinstance(decision, pbt.Continue):
                    tx.search.update_steered(
                        decision.trial_id, SteeredUpdate(due_step=decision.due_step)
                    )
                    continue
                if made >= view.search.max_trials:
                    # the search has spent its trials: the member trains on
                    step = int(view.links[decision.trial_id].extra.get("step", 0))
                    tx.search.update_steered(
                        decision.trial_id,
                        SteeredUpdate(due_step=step + searcher.perturbation_interval),
                    )
                    continue
                trial = view.trials[decision.trial_id]
                self._request_stop(tx, trial, StopIntent.PRUNE, decision.reason)
                report.pruned.append(trial.id)
                donor_step = int(view.links[decision.donor_id].extra.get("step", 0))
                link = self._add_trial(
                    tx,
                    view,
                    decision.hparams,
                    None,
                    parent=decision.donor_id,
                    warm_start=decision.checkpoint_id,
                    due_step=donor_step + searcher.perturbation_interval,
                    why=f"pbt: exploits trial {decision.donor_id} (checkpoint "
                    f"{decision.checkpoint_id}) in place of trial {trial.id}",
                )
                self._copy_checkpoint(tx, decision, link.trial_id)
                report.created.append(link.trial_id)
                made += 1
            tx.search.update_search(
                view.search.experiment_id, SearchUpdate(rng_state=view.search.rng_state + 1)
            )

    def _copy_checkpoint(self, tx: SearchTx, decision: pbt.Exploit, child_id: int) -> None:
        """Give a new PBT member the donor's checkpoint as its own first checkpoint.

        A copy, not a reference: the donor trains on and its retention deletes old checkpoints,
        while the child restores (and restarts from) its own latest checkpoint as any trial does.
        """
        source = tx.repo.get_checkpoint(decision.checkpoint_id)
        if source is None:  # deleted by the donor's retention since the decision was read
            latest = tx.repo.list_checkpoints(decision.donor_id)
            if not latest:
                return
            source = latest[-1]
        child = tx.repo.get_trial(child_id)
        assert child is not None
        uuid = f"pbt-{child_id}-{source.uuid}"[:64]
        if is_checkpoint_set(source.storage_key):  # sharded (ADR 0040): member by member
            key = checkpoint_set_key(child.tenant, child_id, uuid)
            size = copy_set(self.store, source.storage_key, key)
        else:
            key = checkpoint_key(child.tenant, child_id, uuid)
            data = self.store.get(source.storage_key)
            self.store.put(key, data)
            size = len(data)
        now = self.clock()
        tx.repo.add_checkpoint(child_id, uuid, source.step, 0, dict(source.metrics), key, size, now)
        tx.repo.add_event(
            child_id,
            "checkpoint",
            f"starts from trial {source.trial_id}'s checkpoint {source.id} at step {source.step}",
            now,
        )

    # ---------------------------------------------------------------- the end
    def _maybe_finish(self, view: _View, study: StudyConfig, report: SearchTickReport) -> None:
        if any(not t.state.is_terminal for t in view.trials.values()):
            return
        if any(not link.told for link in view.links.values()):
            return  # the next tick tells them first
        search = view.search
        spent = len(view.links) >= search.max_trials
        exhausted = view.spec.searcher.kind == "search" and self.backend.is_exhausted(study)
        pbt_done = view.spec.searcher.kind == "pbt" and len(view.links) > 0
        canceled = view.experiment_state == ExperimentState.CANCELED
        ended = spent or exhausted or pbt_done or canceled or _metric_missing(view)
        if search.state == SearchState.RUNNING and not ended:
            return
        if search.state == SearchState.PAUSED and not canceled:
            return
        with self.uow() as tx:
            state = SearchState.KILLED if canceled else SearchState.FINISHED
            tx.search.update_search(search.experiment_id, SearchUpdate(state=state))
            refresh_experiment_state(tx.repo, search.experiment_id, self.clock(), search_done=True)
        report.finished.append(search.experiment_id)

    # ---------------------------------------------------------------- control loop hooks
    def state_after_stop(self, trial: Trial, default: TrialState) -> TrialState:
        """PRUNED for a pruned trial, PAUSED for a paused one; else what the loop chose."""
        with self.uow() as tx:
            link = tx.search.get_steered(trial.id)
        if link is None or link.stop_intent is None:
            return default
        wanted = {
            StopIntent.PRUNE: TrialState.PRUNED,
            StopIntent.PAUSE: TrialState.PAUSED,
            StopIntent.FAIL: TrialState.FAILED,
        }[link.stop_intent]
        expected = {
            StopIntent.PRUNE: TrialState.CANCELED,
            StopIntent.PAUSE: TrialState.QUEUED,
            StopIntent.FAIL: TrialState.CANCELED,
        }
        if default != expected[link.stop_intent]:
            return default
        return wanted if wanted in LEGAL_TRANSITIONS[trial.state] else default

    def warm_start(self, trial: Trial) -> int | None:
        """The checkpoint a trial without checkpoints of its own starts from, if any.

        Any trial of an experiment with ``searcher.source_checkpoint_id`` (a clone) starts
        from that one, if its tenant may read it. (A PBT member needs no hook: it is born with a
        copy of its donor's checkpoint as its own.)
        """
        with self.uow() as tx:
            experiment = tx.repo.experiment_of(trial.id)
            source = self._spec(experiment.id, experiment.spec).searcher.source_checkpoint_id
            if source is None:
                return None
            checkpoint = tx.repo.get_checkpoint(source)
            if checkpoint is None:
                return None
            owner = tx.repo.get_trial(checkpoint.trial_id)
            return source if owner is not None and owner.tenant == trial.tenant else None


def _metric_missing(view: _View) -> bool:
    """A trial failed for not reporting the searcher's metric (``require_metric``)."""
    return any(link.stop_intent == StopIntent.FAIL for link in view.links.values())


def _parsed_mutations(raw: dict[str, Any]) -> tuple[Distribution, ...]:
    from trainhub.core.search_space import parse_space

    return parse_space(raw, "searcher.mutations").distributions
