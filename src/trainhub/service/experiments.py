"""Use cases of experiments and trials: submit, list, show, cancel.

Submitting writes rows and the context and returns at once; the control loop starts the trial.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, Protocol

from trainhub.core import fairshare
from trainhub.core.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    InvalidSpec,
    NotFound,
    PermissionDenied,
)
from trainhub.core.federated_spec import FederatedSpec
from trainhub.core.isolation import NodeIsolation, TrialResources, isolation_profile
from trainhub.core.model_parallel import tensor_group_unfittable
from trainhub.core.model_spec import zoo_error
from trainhub.core.resources import (
    Node,
    ResourceRequest,
    can_ever_fit,
    largest_node_capacity,
    total_slots,
)
from trainhub.core.searcher_spec import SearcherSpec
from trainhub.core.spec import (
    ExperimentSpec,
    Priority,
    Resources,
    check_entrypoint_exists,
    parse_spec,
)
from trainhub.core.states import ExperimentState, TrialState, experiment_state
from trainhub.service.auth import (
    check_read,
    check_write,
    choose_tenant,
    require_user,
    visible_tenants,
)
from trainhub.service.clock import Clock
from trainhub.service.context_archive import DEFAULT_MAX_CONTEXT_BYTES, check_context
from trainhub.service.datasets import no_datasets
from trainhub.service.environments import request_lines
from trainhub.service.keys import staged_context_key
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import (
    Attempt,
    Checkpoint,
    Experiment,
    LayerAlertRecord,
    TrafficRecord,
    Trial,
    TrialEvent,
    TrialUpdate,
)
from trainhub.service.repository import ExperimentStore, TrialStore, UnitOfWork
from trainhub.service.trial_writes import write_trial

log = logging.getLogger(__name__)


def check_fits_cluster(
    resources: Resources,
    nodes: list[Node],
    federated: FederatedSpec | None = None,
    *,
    tensor: int = 1,
) -> None:
    """Refuse, at submit, a trial that no node (or the whole cluster) could ever hold, naming
    the spec field and the largest node's capacity.

    Judged against each alive node's total capacity, not what is free now; with no node
    known (the cluster is starting) nothing is refused and the queue explains later. A
    federation's rank count is ``federated.clients`` + 1: that is the field named.
    """
    largest = largest_node_capacity(nodes)
    if largest is None:
        return
    request = ResourceRequest.from_spec(resources)
    unfit = can_ever_fit(request, nodes)
    if unfit is None:
        tensor_unfit = tensor_group_unfittable(request, tensor, nodes)
        if tensor_unfit is not None:
            raise InvalidSpec(
                [
                    FieldError(
                        tensor_unfit.field,
                        tensor_unfit.message,
                        "lower distributed.tensor (pipeline stages may span nodes), or ask for "
                        "fewer GPUs/CPUs per worker",
                    )
                ]
            )
        grouped = can_ever_fit(replace(request, group_size=tensor), nodes) if tensor > 1 else None
        if grouped is not None:  # the ranks fit, but not in whole tensor groups per node
            raise InvalidSpec(
                [
                    FieldError(
                        "distributed.tensor",
                        f"{grouped.message} (each node holds whole groups of {tensor} only)",
                        "lower distributed.tensor, or ask for fewer workers",
                    )
                ]
            )
        return
    message = unfit.message
    if "largest node" not in message:
        message += f"; the largest node has {largest.describe()}"
    hint = "ask for what the cluster can hold"
    field = unfit.field
    if federated is not None and field == "resources.workers":
        field = "federated.clients"
        message = f"{federated.clients} clients and the server need {resources.workers} " + (
            message.replace(f"asks for {resources.workers} workers", "ranks")
        )
        hint = "use fewer clients, or smaller cpus_per_worker"
    raise InvalidSpec([FieldError(field, message, hint)])


@dataclass(frozen=True)
class ExperimentDetail:
    experiment: Experiment
    trials: list[Trial]


# the trial's JSON and `trainhub show` list this many layer-health alerts (the route lists all)
TRIAL_ALERTS_SHOWN = 50


@dataclass(frozen=True)
class TrialDetail:
    trial: Trial
    experiment: Experiment
    attempts: list[Attempt]
    checkpoints: list[Checkpoint]
    events: list[TrialEvent]
    alerts: list[LayerAlertRecord] = field(default_factory=list)  # layer health, earliest first
    # what contains each rank (core/isolation.py IsolationProfile.summary); empty: nothing
    limits: dict[str, str] = field(default_factory=dict)
    # network bytes per attempt, rank and scope (issue 30, docs/adr/0045)
    traffic: list[TrafficRecord] = field(default_factory=list)


class _TrialsOfExperiments(TrialStore, ExperimentStore, Protocol):
    """The roles refresh_experiment_state uses."""


def trial_limits(spec: dict[str, Any], isolation: NodeIsolation | None) -> dict[str, str]:
    """What contains each rank of a trial of ``spec`` (as its rank actors will apply it)."""
    if isolation is None:
        return {"sandbox": "none: ranks run as plain processes, without limits"}
    resources = spec.get("resources") or {}
    profile = isolation_profile(
        TrialResources(
            cpus_per_worker=float(resources.get("cpus_per_worker", 1.0)),
            memory_gb_per_worker=resources.get("memory_gb_per_worker"),
            pin_cpus=bool(resources.get("pin_cpus", False)),
            num_nodes=1,
        ),
        isolation,
    )
    shown = profile.summary()
    if not resources.get("single_node") and resources.get("workers", 1) > 1:
        shown["network"] += " (if its ranks share a node; the node's network across nodes)"
    return shown


def refresh_experiment_state(
    repo: _TrialsOfExperiments, experiment_id: int, now: float, search_done: bool = False
) -> None:
    """Derive the experiment's state from its trials (after a trial ended).

    A search ends when its searcher has no more trials to make (``service/search.py`` passes
    ``search_done``), not when its running trials happen to have ended; a cancel ends it.
    """
    states = repo.trial_states(experiment_id)
    state = experiment_state(states)
    if state in (ExperimentState.COMPLETED, ExperimentState.FAILED) and not search_done:
        spec = repo.experiment_specs([experiment_id]).get(experiment_id) or {}
        searcher = spec.get("searcher") or {}
        if SearcherSpec.model_validate(searcher).kind != "single":
            state = ExperimentState.ACTIVE
    repo.set_experiment_state(
        experiment_id, state, now if state != ExperimentState.ACTIVE else None
    )


class ExperimentService:
    def __init__(
        self,
        uow: UnitOfWork,
        store: ArtifactStore,
        clock: Clock,
        wake_scheduler: Callable[[], None] = lambda: None,
        max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
        cluster_nodes: Callable[[], list[Node]] = list,
    ) -> None:
        self.uow = uow
        self.store = store
        self.clock = clock
        self.wake_scheduler = wake_scheduler
        self.max_context_bytes = max_context_bytes
        self.cluster_nodes = cluster_nodes
        # the nodes' containment (None: ranks are not sandboxed); shown with each trial
        self.isolation: NodeIsolation | None = None
        # told before an experiment's trials are canceled: its search makes no more trials
        self.on_cancel: Callable[[int], None] = lambda experiment_id: None
        # checks and pins model.init_from and distill.teacher (service/registry.py wires it)
        self.resolve_model: Callable[[Principal, str, ExperimentSpec], ExperimentSpec] = (
            _no_registry
        )
        # refuses, at submit, packages that cannot become an environment (service/environments)
        self.check_environment: Callable[
            [ExperimentSpec, bytes | BinaryIO | None, set[str]], None
        ] = _check_environment_without_base
        # checks and pins the spec's data list (service/datasets.py wires it)
        self.resolve_data: Callable[[Principal, str, ExperimentSpec], ExperimentSpec] = no_datasets

    def submit(
        self,
        principal: Principal,
        spec_yaml: str,
        context: bytes | BinaryIO | None,
        tenant: str | None,
    ) -> ExperimentDetail:
        """Check everything that can be checked now, store the context, write the rows.

        ``context`` is the tar.gz archive, as bytes or a seekable file; it is read in chunks
        and copied into the store before the database transaction opens.
        """
        tenant_name = choose_tenant(principal, tenant)
        check_write(principal, tenant_name, f"tenant {tenant_name!r}")
        spec = parse_spec(spec_yaml)
        source = io.BytesIO(context) if isinstance(context, bytes) else context
        if isinstance(context, bytes) and not context:
            source = None
        files = check_context(source, self.max_context_bytes) if source is not None else set()
        check_entrypoint_exists(spec, files)
        if spec.environment.wants_packages:  # the file is there, the requests acceptable
            self.check_environment(spec, source, files)
        if spec.priority == Priority.URGENT and not principal.is_admin:
            raise PermissionDenied(
                "only cluster admins may submit with priority 'urgent'", "use 'high'"
            )
        check_fits_cluster(
            spec.resources, self._nodes(), spec.federated, tensor=spec.distributed.tensor
        )
        unknown_zoo = spec.model.arch and zoo_error(spec.model.arch.zoo, "model.arch.zoo")
        if unknown_zoo:
            raise InvalidSpec([unknown_zoo])
        spec = self.resolve_model(principal, tenant_name, spec)
        spec = self.resolve_data(principal, tenant_name, spec)
        assert principal.user_id is not None
        key = None
        size = 0
        if source is not None:
            key = staged_context_key(tenant_name, uuid.uuid4().hex)
            size = self.store.put_file(key, source)
        try:
            detail = self._add(principal, spec, spec_yaml, tenant_name, key, size)
        except BaseException:
            if key is not None:
                self.store.delete(key)
            raise
        self.wake_scheduler()
        return detail

    def _nodes(self) -> list[Node]:
        try:
            return self.cluster_nodes()
        except Exception:  # the cluster cannot be asked now: the queue will tell
            log.warning("cluster capacity unknown at submit", exc_info=True)
            return []

    def _add(
        self,
        principal: Principal,
        spec: ExperimentSpec,
        spec_yaml: str,
        tenant_name: str,
        key: str | None,
        size: int,
    ) -> ExperimentDetail:
        assert principal.user_id is not None
        now = self.clock()
        with self.uow() as repo:
            if repo.get_tenant(tenant_name) is None:
                raise NotFound(f"tenant {tenant_name!r} does not exist")
            experiment = repo.add_experiment(
                tenant=tenant_name,
                owner_id=principal.user_id,
                name=spec.name,
                project=spec.project,
                spec=spec.model_dump(mode="json"),
                spec_yaml=spec_yaml,
                context_size=size,
                now=now,
            )
            if key is not None:
                repo.set_experiment_context(experiment.id, key)
            trials = []
            if spec.searcher.kind == "single":  # a search's trials come from its searcher
                trial = repo.add_trial(
                    experiment.id, dict(spec.hyperparameters), spec.priority, now
                )
                repo.add_event(trial.id, "submitted", f"submitted by {principal.username}", now)
                trials.append(trial)
            return ExperimentDetail(_must(repo.get_experiment(experiment.id)), trials)

    def list_experiments(
        self,
        principal: Principal,
        state: ExperimentState | None = None,
        limit: int = 50,
        offset: int = 0,
        *,
        project: str | None = None,
        name_contains: str | None = None,
        tenant: str | None = None,
        owner: str | None = None,
        sort: str = "created",
        order: str = "desc",
    ) -> tuple[list[Experiment], int]:
        """A page of the visible experiments. A ``tenant`` the principal cannot see gives an
        empty page, as one without experiments does (no error that tells it exists)."""
        require_user(principal)
        with self.uow() as repo:
            return repo.list_experiments(
                visible_tenants(principal),
                state,
                limit,
                offset,
                project=project,
                name_contains=name_contains,
                tenant=tenant,
                owner=owner,
                sort=sort,
                order=order,
            )

    def get(self, principal: Principal, experiment_id: int) -> ExperimentDetail:
        require_user(principal)
        with self.uow() as repo:
            experiment = repo.get_experiment(experiment_id)
            if experiment is None:
                raise NotFound(f"experiment {experiment_id} does not exist")
            check_read(principal, experiment.tenant, f"experiment {experiment_id}")
            return ExperimentDetail(experiment, repo.list_trials(experiment_id))

    def get_trial(self, principal: Principal, trial_id: int) -> TrialDetail:
        require_user(principal)
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_read(principal, trial.tenant, f"trial {trial_id}")
            experiment = repo.experiment_of(trial_id)
            return TrialDetail(
                trial,
                experiment,
                repo.list_attempts(trial_id),
                repo.list_checkpoints(trial_id),
                repo.list_events(trial_id),
                repo.list_layer_alerts(trial_id, TRIAL_ALERTS_SHOWN),
                trial_limits(experiment.spec, self.isolation),
                repo.trial_traffic(trial_id),
            )

    def cancel_experiment(self, principal: Principal, experiment_id: int) -> ExperimentDetail:
        detail = self.get(principal, experiment_id)
        check_write(principal, detail.experiment.tenant, f"experiment {experiment_id}")
        self.on_cancel(experiment_id)
        for trial in detail.trials:
            if not trial.state.is_terminal:
                self.cancel_trial(principal, trial.id)
        return self.get(principal, experiment_id)

    def cancel_trial(self, principal: Principal, trial_id: int) -> Trial:
        require_user(principal)
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_write(principal, trial.tenant, f"trial {trial_id}")
        return self._cancel(trial_id, f"canceled by {principal.username}")

    def stop_trial_as_platform(self, trial_id: int, reason: str) -> Trial:
        """Cancel a trial for a rule of the platform (an idle session), saying why."""
        return self._cancel(trial_id, reason)

    def _cancel(self, trial_id: int, reason: str) -> Trial:
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            if trial.state == TrialState.CANCELED:
                return trial
            if trial.state.is_terminal:
                raise Conflict(f"trial {trial_id} already ended ({trial.state})")
            if trial.state in (TrialState.QUEUED, TrialState.PAUSED):
                trial = write_trial(
                    repo,
                    trial_id,
                    TrialUpdate(
                        state=TrialState.CANCELED,
                        ended_at=now,
                        pending_reason=None,
                        message=reason,
                    ),
                    current=trial.state,
                )
                refresh_experiment_state(repo, trial.experiment_id, now)
            else:
                # the control loop ends the processes and then records CANCELED
                trial = repo.update_trial(
                    trial_id, TrialUpdate(cancel_requested=True, stop_reason=reason)
                )
            repo.add_event(trial_id, "cancel", reason, now)
        self.wake_scheduler()
        return trial

    def set_priority(self, principal: Principal, trial_id: int, priority: str) -> Trial:
        """Change a trial's priority; the scheduler uses it from its next tick."""
        require_user(principal)
        try:
            level = Priority(priority)
        except ValueError:
            raise InvalidRequest(
                f"priority {priority!r} does not exist", "use low, normal, high or urgent"
            ) from None
        if level == Priority.URGENT and not principal.is_admin:
            raise PermissionDenied("only cluster admins may set priority 'urgent'", "use 'high'")
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_write(principal, trial.tenant, f"trial {trial_id}")
            if trial.state.is_terminal:
                raise Conflict(f"trial {trial_id} already ended ({trial.state})")
            trial = repo.update_trial(trial_id, TrialUpdate(priority=level.value))
            repo.add_event(
                trial_id, "priority", f"priority set to {level} by {principal.username}", now
            )
        self.wake_scheduler()
        return trial

    def queue(self, principal: Principal) -> list[Trial]:
        """Queued trials one may see, in the order the scheduler would start them."""
        require_user(principal)
        allowed = visible_tenants(principal)
        with self.uow() as repo:
            queued = repo.trials_in_states([TrialState.QUEUED, TrialState.PAUSED])
        visible = [t for t in queued if allowed is None or t.tenant in allowed]
        return sorted(
            visible,
            key=lambda t: (t.queue_position is None, t.queue_position or 0, t.submitted_at, t.id),
        )

    def guarantee_note(self, principal: Principal) -> str | None:
        """What the queue says when tenant guarantees add up to more than the cluster (the
        fair policy scales them down), else None; None too while the cluster cannot be asked."""
        require_user(principal)
        nodes = self._nodes()
        if not nodes:
            return None
        with self.uow() as repo:
            guarantees = {t.name: t.guaranteed_slots for t in repo.list_tenants()}
        unit = "GPUs" if any(n.alive and n.total_gpus for n in nodes) else "CPUs"
        return fairshare.guarantee_note(guarantees, total_slots(nodes), unit)

    def spec_of(self, experiment: Experiment) -> ExperimentSpec:
        return ExperimentSpec.model_validate(experiment.spec)


def _check_environment_without_base(
    spec: ExperimentSpec, context: bytes | BinaryIO | None, files: set[str]
) -> None:
    request_lines(spec, context, files, {})


def _no_registry(principal: Principal, tenant: str, spec: ExperimentSpec) -> ExperimentSpec:
    named = [
        path
        for path, value in (
            ("model.init_from", spec.model.init_from),
            ("distill.teacher", spec.distill.teacher if spec.distill else None),
        )
        if value is not None
    ]
    if named:
        missing = "this server has no model registry"
        raise InvalidSpec([FieldError(path, missing, "ask an admin") for path in named])
    return spec


def _must(value: Experiment | None) -> Experiment:
    assert value is not None
    return value
