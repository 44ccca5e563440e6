"""People in the loop: pause, resume, kill and clone trials and experiments; a search's limits
and results.

Pausing a running trial asks it to checkpoint and stop (PREEMPTING, ``should_stop()`` with the
reason); the control loop then parks it PAUSED instead of queueing it again, which frees its
slots. Resuming queues it; it restarts from its latest checkpoint. Pausing an experiment pauses
its trials and, for a search, makes no new ones until it is resumed.

Cloning submits a copy of an experiment's spec with changes (``lr=0.01``,
``searcher.max_trials=64``) and the same code; ``from_trial`` warm-starts it from that trial's
latest checkpoint (``searcher.source_checkpoint_id``).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from trainhub.core import limits
from trainhub.core.errors import Conflict, InvalidRequest, NotFound, TooLarge
from trainhub.core.spec import NAME_PATTERN, ExperimentSpec, parse_spec
from trainhub.core.states import TrialState, experiment_state
from trainhub.service.auth import (
    check_read,
    check_write,
    choose_tenant,
    require_user,
    visible_tenants,
)
from trainhub.service.clock import Clock
from trainhub.service.context_archive import check_context
from trainhub.service.experiments import ExperimentDetail, ExperimentService
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import KEEP, AttemptUpdate, Experiment, Trial, TrialUpdate
from trainhub.service.search import is_better, study_config
from trainhub.service.search_ports import (
    SearchBackend,
    SearchRecord,
    SearchState,
    SearchTx,
    SearchUnitOfWork,
    SearchUpdate,
    SpecTemplate,
    SteeredTrial,
    SteeredUpdate,
    StopIntent,
)
from trainhub.service.trial_writes import write_trial

# the same name as trainhub.runtime.protocol.ENV_SAMPLE_FILTER (a test keeps them equal)
SAMPLE_FILTER_ENV = "TRAINHUB_SAMPLE_FILTER"


@dataclass(frozen=True)
class SampleFilter:
    """Samples a cloned trial leaves out or relabels (``TRAINHUB_SAMPLE_FILTER``)."""

    drop: tuple[int, ...] = ()
    relabel: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, drop: list[int], relabel: dict[str, int]) -> SampleFilter:
        pairs = []
        for key, label in relabel.items():
            try:
                sample_id = int(key)
            except ValueError:
                raise InvalidRequest(
                    f"relabel: {key[:40]!r} is not a sample id", "map ids to labels: {'17': 3}"
                ) from None
            if not 0 <= sample_id <= limits.INT64_MAX or not 0 <= label < limits.MAX_SAMPLE_CLASSES:
                raise InvalidRequest(f"relabel: {key} -> {label} is out of range")
            pairs.append((sample_id, label))
        if len(drop) + len(pairs) > limits.MAX_FILTERED_SAMPLES:
            raise TooLarge(
                f"{len(drop) + len(pairs)} samples to drop or relabel; the limit is "
                f"{limits.MAX_FILTERED_SAMPLES}",
                "drop a smaller fraction",
            )
        return cls(tuple(sorted(set(drop))), tuple(sorted(pairs)))

    def __bool__(self) -> bool:
        return bool(self.drop or self.relabel)

    def to_json(self) -> str:
        relabel = {str(k): v for k, v in self.relabel}
        return json.dumps({"drop": list(self.drop), "relabel": relabel}, separators=(",", ":"))


def _done(trial: Trial) -> int | None:
    current = trial.progress.get("current")
    if isinstance(current, int | float) and not isinstance(current, bool):
        return int(current)
    step = trial.latest_metrics.get("step")
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None


@dataclass(frozen=True)
class TrialResult:
    """One row of ``trainhub trials``: a trial with its best metric and how far it got."""

    trial: Trial
    metric: float | None  # best value of the searcher's metric
    # how far it got: what the script said with ctx.set_progress (epochs done), else the
    # latest step it reported (0-based epochs for most scripts)
    steps: int | None
    stop_detail: str | None  # why it was pruned or paused
    parent_trial_id: int | None


@dataclass(frozen=True)
class SearchProgress:
    experiment: Experiment
    search: SearchRecord | None  # None for a single-trial experiment
    metric: str | None
    mode: str
    counts: dict[str, int]  # trials by state
    results: list[TrialResult]  # best first
    best: TrialResult | None


class SteeringService:
    def __init__(
        self,
        uow: SearchUnitOfWork,
        experiments: ExperimentService,
        store: ArtifactStore,
        backend: SearchBackend,
        clock: Clock,
    ) -> None:
        self.uow = uow
        self.experiments = experiments
        self.store = store
        self.backend = backend
        self.clock = clock
        experiments.on_cancel = self._stop_search  # a canceled search makes no more trials

    # ---------------------------------------------------------------- pause and resume
    def pause_trial(self, principal: Principal, trial_id: int) -> Trial:
        with self.uow() as tx:
            trial = self._writable_trial(tx, principal, trial_id)
            trial = self._pause(tx, principal, trial)
        self.experiments.wake_scheduler()
        return trial

    def resume_trial(self, principal: Principal, trial_id: int) -> Trial:
        with self.uow() as tx:
            trial = self._writable_trial(tx, principal, trial_id)
            if trial.state != TrialState.PAUSED and not (
                trial.state == TrialState.PREEMPTING and self._pausing(tx, trial.id)
            ):
                raise Conflict(
                    f"trial {trial_id} is {trial.state}, not paused",
                    "only a PAUSED trial (or one being paused) can be resumed",
                )
            trial = self._resume(tx, principal, trial)
        self.experiments.wake_scheduler()
        return trial

    def pause_experiment(self, principal: Principal, experiment_id: int) -> SearchProgress:
        with self.uow() as tx:
            experiment = self._writable_experiment(tx, principal, experiment_id)
            self._refuse_if_ended(tx, experiment_id, "pause")
            if tx.search.get_search(experiment_id) is not None:
                search = tx.search.get_search(experiment_id)
                if search is not None and search.state == SearchState.RUNNING:
                    tx.search.update_search(experiment_id, SearchUpdate(state=SearchState.PAUSED))
            for trial in tx.repo.list_trials(experiment.id):
                if not trial.state.is_terminal and trial.state != TrialState.PAUSED:
                    self._pause(tx, principal, trial)
        self.experiments.wake_scheduler()
        return self.progress(principal, experiment_id)

    def resume_experiment(self, principal: Principal, experiment_id: int) -> SearchProgress:
        with self.uow() as tx:
            experiment = self._writable_experiment(tx, principal, experiment_id)
            self._refuse_if_ended(tx, experiment_id, "resume")
            search = tx.search.get_search(experiment_id)
            if search is not None and search.state == SearchState.PAUSED:
                tx.search.update_search(experiment_id, SearchUpdate(state=SearchState.RUNNING))
            for trial in tx.repo.list_trials(experiment.id):
                if trial.state == TrialState.PAUSED or (
                    trial.state == TrialState.PREEMPTING and self._pausing(tx, trial.id)
                ):
                    self._resume(tx, principal, trial)
        self.experiments.wake_scheduler()
        return self.progress(principal, experiment_id)

    def _refuse_if_ended(self, tx: SearchTx, experiment_id: int, verb: str) -> None:
        """Pausing or resuming an experiment that has ended would do nothing: say so (409)."""
        search = tx.search.get_search(experiment_id)
        if search is not None and search.state in (SearchState.RUNNING, SearchState.PAUSED):
            return  # a search still makes trials
        states = [t.state for t in tx.repo.list_trials(experiment_id)]
        if states and all(s.is_terminal for s in states):
            ended = experiment_state(states)
            raise Conflict(
                f"experiment {experiment_id} has ended ({ended}): there is nothing to {verb}",
                f"run it again with `trainhub clone {experiment_id}`",
            )

    def _pausing(self, tx: SearchTx, trial_id: int) -> bool:
        link = tx.search.get_steered(trial_id)
        return link is not None and link.stop_intent == StopIntent.PAUSE

    def _steered(self, tx: SearchTx, trial: Trial) -> SteeredTrial:
        link = tx.search.get_steered(trial.id)
        if link is None:  # a trial of a single-trial experiment, steered for the first time
            link = tx.search.add_steered(SteeredTrial(trial.id, trial.experiment_id))
        return link

    def _pause(self, tx: SearchTx, principal: Principal, trial: Trial) -> Trial:
        now = self.clock()
        why = f"paused by {principal.username}"
        if trial.state == TrialState.PAUSED:
            return trial
        if trial.state.is_terminal:
            raise Conflict(f"trial {trial.id} already ended ({trial.state})")
        link = self._steered(tx, trial)
        if link.stop_intent in (StopIntent.PRUNE, StopIntent.FAIL):
            return trial  # it is ending anyway
        tx.search.update_steered(
            trial.id, SteeredUpdate(stop_intent=StopIntent.PAUSE, stop_detail=why)
        )
        if trial.state == TrialState.QUEUED:
            update = TrialUpdate(
                state=TrialState.PAUSED, pending_reason=f"{why}; resume to queue it again"
            )
            trial = write_trial(tx.repo, trial.id, update, current=trial.state)
        elif trial.state in (TrialState.SCHEDULED, TrialState.RUNNING):
            # checkpoint and stop, as a preemption does; the control loop parks it PAUSED
            update = TrialUpdate(state=TrialState.PREEMPTING, stop_reason=why)
            trial = write_trial(tx.repo, trial.id, update, current=trial.state)
            attempt = tx.repo.open_attempt(trial.id)
            if attempt is not None:  # should_stop() from now; SIGTERM after the stop wait
                tx.repo.update_attempt(attempt.id, AttemptUpdate(stop_requested_at=now))
        tx.repo.add_event(trial.id, "pause", why, now)
        return trial

    def _resume(self, tx: SearchTx, principal: Principal, trial: Trial) -> Trial:
        now = self.clock()
        why = f"resumed by {principal.username}"
        tx.search.update_steered(trial.id, SteeredUpdate(stop_intent=None, stop_detail=None))
        if trial.state == TrialState.PAUSED:
            update = TrialUpdate(
                state=TrialState.QUEUED,
                queued_at=now,
                stop_reason=None,
                pending_reason=f"{why}; resumes from its latest checkpoint",
            )
            trial = write_trial(tx.repo, trial.id, update, current=trial.state)
        tx.repo.add_event(trial.id, "resume", why, now)
        return trial

    # ---------------------------------------------------------------- kill and limits
    def kill_trial(self, principal: Principal, trial_id: int) -> Trial:
        """Stop a trial for good (a search tells its sampler it failed)."""
        return self.experiments.cancel_trial(principal, trial_id)

    def kill_experiment(self, principal: Principal, experiment_id: int) -> ExperimentDetail:
        """Cancel every trial; a search makes no more (cancel_experiment tells us first)."""
        return self.experiments.cancel_experiment(principal, experiment_id)

    def _stop_search(self, experiment_id: int) -> None:
        with self.uow() as tx:
            search = tx.search.get_search(experiment_id)
            if search is not None and search.state != SearchState.FINISHED:
                tx.search.update_search(experiment_id, SearchUpdate(state=SearchState.KILLED))

    def set_limits(
        self,
        principal: Principal,
        experiment_id: int,
        max_trials: int | None,
        max_concurrent_trials: int | None,
    ) -> SearchProgress:
        """Raise or lower a running search's limits; raising max_trials revives a finished one."""
        for name, value in (
            ("max_trials", max_trials),
            ("max_concurrent_trials", max_concurrent_trials),
        ):
            if value is not None and value < 1:
                raise InvalidRequest(f"{name} must be at least 1, got {value}")
        with self.uow() as tx:
            self._writable_experiment(tx, principal, experiment_id)
            search = tx.search.get_search(experiment_id)
            if search is None:
                raise Conflict(
                    f"experiment {experiment_id} is not a search",
                    "clone it with a searcher: trainhub clone ID --set searcher.sampler=tpe",
                )
            if search.state == SearchState.KILLED:
                raise Conflict(f"the search of experiment {experiment_id} was killed")
            revive = max_trials is not None and (
                search.state == SearchState.FINISHED
                and max_trials > len(tx.search.list_steered(experiment_id))
            )
            update = SearchUpdate(
                max_trials=KEEP if max_trials is None else max_trials,
                max_concurrent_trials=(
                    KEEP if max_concurrent_trials is None else max_concurrent_trials
                ),
                state=SearchState.RUNNING if revive else KEEP,
            )
            if update.changes():
                tx.search.update_search(experiment_id, update)
        self.experiments.wake_scheduler()
        return self.progress(principal, experiment_id)

    # ---------------------------------------------------------------- clone
    def clone_experiment(
        self,
        principal: Principal,
        experiment_id: int,
        changes: dict[str, Any],
        from_trial: int | None = None,
    ) -> ExperimentDetail:
        detail = self.experiments.get(principal, experiment_id)
        return self._clone(principal, detail.experiment, changes, from_trial, hparams=None)

    def clone_trial(
        self,
        principal: Principal,
        trial_id: int,
        changes: dict[str, Any],
        from_checkpoint: bool = True,
        sample_filter: SampleFilter | None = None,
    ) -> ExperimentDetail:
        """A single-trial experiment with this trial's hyperparameters, changed as asked;
        ``sample_filter`` names samples its data loaders leave out or relabel."""
        detail = self.experiments.get_trial(principal, trial_id)
        if sample_filter:
            changes = {
                **changes,
                f"environment.variables.{SAMPLE_FILTER_ENV}": sample_filter.to_json(),
            }
        return self._clone(
            principal,
            detail.experiment,
            changes,
            trial_id if from_checkpoint else None,
            hparams=dict(detail.trial.hparams),
        )

    def _clone(
        self,
        principal: Principal,
        experiment: Experiment,
        changes: dict[str, Any],
        from_trial: int | None,
        hparams: dict[str, Any] | None,
    ) -> ExperimentDetail:
        spec = copy.deepcopy(experiment.spec)
        if hparams is not None:  # one trial, its values as constants
            spec["hyperparameters"] = hparams
            spec["searcher"] = {
                "name": "single",
                "metric": spec["searcher"].get("metric"),
                "mode": spec["searcher"].get("mode", "max"),
            }
        for path, value in changes.items():
            apply_change(spec, path, value)
        if from_trial is not None:
            with self.uow() as tx:
                source = tx.repo.get_trial(from_trial)
                if source is None:
                    raise NotFound(f"trial {from_trial} does not exist")
                check_read(principal, source.tenant, f"trial {from_trial}")
                checkpoints = tx.repo.list_checkpoints(from_trial)
            if not checkpoints:
                raise Conflict(
                    f"trial {from_trial} has no checkpoint to start from",
                    "clone without --from-checkpoint, or wait for its first checkpoint",
                )
            spec.setdefault("searcher", {})["source_checkpoint_id"] = checkpoints[-1].id
        context = self.store.get(experiment.context_key) if experiment.context_key else None
        text = yaml.safe_dump(spec, sort_keys=False)
        return self.experiments.submit(principal, text, context, experiment.tenant)

    # ---------------------------------------------------------------- templates
    def save_template(
        self,
        principal: Principal,
        name: str,
        *,
        experiment_id: int | None = None,
        spec_yaml: str | None = None,
        context: bytes | None = None,
        tenant: str | None = None,
    ) -> SpecTemplate:
        """Save a spec (or an experiment's spec and code) as the tenant's template ``name``."""
        if not re.fullmatch(NAME_PATTERN, name):
            raise InvalidRequest(
                f"template name {name!r} is not allowed",
                "use letters, digits, '-', '_' and '.', starting with a letter or digit",
            )
        if experiment_id is not None:
            experiment = self.experiments.get(principal, experiment_id).experiment
            spec_yaml = experiment.spec_yaml
            context = self.store.get(experiment.context_key) if experiment.context_key else None
            tenant = tenant or experiment.tenant
        if spec_yaml is None:
            raise InvalidRequest("give a spec or an experiment to save as a template")
        parse_spec(spec_yaml)  # a template always submits cleanly (code aside)
        tenant_name = choose_tenant(principal, tenant)
        check_write(principal, tenant_name, f"tenant {tenant_name!r}")
        key = template_context_key(tenant_name, name) if context else None
        if key is not None and context is not None:
            check_context(context, self.experiments.max_context_bytes)
            self.store.put(key, context)
        with self.uow() as tx:
            return tx.search.save_template(
                SpecTemplate(tenant_name, name, spec_yaml, key, principal.username, self.clock())
            )

    def list_templates(self, principal: Principal) -> list[SpecTemplate]:
        require_user(principal)
        with self.uow() as tx:
            return tx.search.list_templates(visible_tenants(principal))

    def submit_template(
        self, principal: Principal, name: str, tenant: str | None, changes: dict[str, Any]
    ) -> ExperimentDetail:
        """Submit the template with changes (``--set lr=0.01``), with the code saved with it."""
        tenant_name = choose_tenant(principal, tenant)
        check_read(principal, tenant_name, f"tenant {tenant_name!r}")
        with self.uow() as tx:
            template = tx.search.get_template(tenant_name, name)
        if template is None:
            raise NotFound(
                f"tenant {tenant_name!r} has no template {name!r}",
                "list them with `trainhub template ls`",
            )
        spec = yaml.safe_load(template.spec_yaml)
        for path, value in changes.items():
            apply_change(spec, path, value)
        context = self.store.get(template.context_key) if template.context_key else None
        text = yaml.safe_dump(spec, sort_keys=False)
        return self.experiments.submit(principal, text, context, tenant_name)

    # ---------------------------------------------------------------- results
    def progress(self, principal: Principal, experiment_id: int) -> SearchProgress:
        detail = self.experiments.get(principal, experiment_id)
        spec = ExperimentSpec.model_validate(detail.experiment.spec)
        metric, mode = spec.searcher.metric, spec.searcher.mode
        with self.uow() as tx:
            search = tx.search.get_search(experiment_id)
            links = {s.trial_id: s for s in tx.search.list_steered(experiment_id)}
        results = []
        for trial in detail.trials:
            link = links.get(trial.id)
            best = link.best_value if link else None
            if best is None and metric is not None:
                latest = trial.latest_metrics.get(metric)
                best = float(latest) if isinstance(latest, int | float) else None
            results.append(
                TrialResult(
                    trial,
                    best,
                    _done(trial),
                    (link.stop_detail if link else None)
                    or (trial.message if trial.state == TrialState.PRUNED else None),
                    link.parent_trial_id if link else None,
                )
            )
        sign = -1.0 if mode == "max" else 1.0
        results.sort(key=lambda r: (r.metric is None, sign * (r.metric or 0.0), r.trial.id))
        counts: dict[str, int] = {}
        for trial in detail.trials:
            counts[trial.state.value] = counts.get(trial.state.value, 0) + 1
        best_result = None
        for result in results:
            if result.metric is not None and is_better(
                result.metric, best_result.metric if best_result else None, mode
            ):
                best_result = result
        return SearchProgress(detail.experiment, search, metric, mode, counts, results, best_result)

    def importance(self, principal: Principal, experiment_id: int) -> dict[str, float]:
        """Optuna's hyperparameter importance over the completed trials of a search."""
        detail = self.experiments.get(principal, experiment_id)
        spec = ExperimentSpec.model_validate(detail.experiment.spec)
        if spec.searcher.kind != "search":
            return {}
        return self.backend.importance(study_config(experiment_id, spec))

    # ---------------------------------------------------------------- access
    def _writable_trial(self, tx: SearchTx, principal: Principal, trial_id: int) -> Trial:
        require_user(principal)
        trial = tx.repo.get_trial(trial_id)
        if trial is None:
            raise NotFound(f"trial {trial_id} does not exist")
        check_write(principal, trial.tenant, f"trial {trial_id}")
        return trial

    def _writable_experiment(
        self, tx: SearchTx, principal: Principal, experiment_id: int
    ) -> Experiment:
        require_user(principal)
        experiment = tx.repo.get_experiment(experiment_id)
        if experiment is None:
            raise NotFound(f"experiment {experiment_id} does not exist")
        check_write(principal, experiment.tenant, f"experiment {experiment_id}")
        return experiment


def template_context_key(tenant: str, name: str) -> str:
    return f"tenants/{tenant}/templates/{name}.tar.gz"


def apply_change(spec: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (dotted) in a spec; a path that is not a spec field is a hyperparameter.

    ``lr=0.01`` sets ``hyperparameters.lr``; ``searcher.max_trials=64`` the searcher's field.
    """
    parts = [p for p in path.split(".") if p]
    if not parts:
        raise InvalidRequest(f"cannot set {path!r}", "use e.g. lr=0.01 or searcher.max_trials=64")
    if parts[0] not in ExperimentSpec.model_fields:
        parts = ["hyperparameters", *parts]
    node = spec
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InvalidRequest(
                f"cannot set {path!r}: {part!r} is a value, not a section",
                "set the value itself, e.g. " + ".".join(parts[: parts.index(part) + 1]) + "=...",
            )
        node = child
    was = node.get(parts[-1])
    if _is_number(was) and isinstance(value, str):
        # `--set lr=1e-3x` or `lr=abc` would reach the script as text: a typo, not a choice
        if isinstance(was, int):  # an integer here: suggest one (`epochs=six` -> epochs=6)
            raise InvalidRequest(
                f"cannot set {path!r} to the text {value!r}: an integer is expected here ({was!r})",
                f"write an integer, e.g. {path}={was}, or a distribution such as "
                f"{path}={{type: int, low: 1, high: {max(2, was * 2)}}}",
            )
        raise InvalidRequest(
            f"cannot set {path!r} to the text {value!r}: it is a number here ({was!r})",
            f"write a number, e.g. {path}=0.01, or a distribution such as "
            f"{path}={{type: float, low: 0.001, high: 0.1}}",
        )
    node[parts[-1]] = value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
