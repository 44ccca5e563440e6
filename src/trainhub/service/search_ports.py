"""Ports of the search and steering use cases, and the records that cross them.

- :class:`SearchBackend`: the search mathematics (Optuna's samplers and pruners through
  ask-and-tell, its storage in our database): ``trainhub.adapters.optuna_search``.
- :class:`SearchRepository`: our own rows about searches (one per search experiment: its state
  and limits) and about steered trials (which Optuna trial a trial is, what was reported to it,
  why it was stopped, which checkpoint it warm-starts from): ``trainhub.adapters.db``.
- :class:`SearchUnitOfWork`: one transaction over both repositories, so a trial and its link to
  the Optuna trial are written together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from trainhub.core.search_space import SearchSpace
from trainhub.core.states import TrialState
from trainhub.service.records import KEEP, Keep, Trial, changes_of
from trainhub.service.repository import Repository


class SearchState(StrEnum):
    RUNNING = "RUNNING"  # makes new trials while below its limits
    PAUSED = "PAUSED"  # makes no new trials; its trials are paused
    FINISHED = "FINISHED"  # every trial it will make has ended
    KILLED = "KILLED"  # stopped by a user: no new trials


class StopIntent(StrEnum):
    """Why the control plane asked a trial to stop, beyond cancel and preemption."""

    PRUNE = "prune"  # the pruner or PBT: ends PRUNED
    PAUSE = "pause"  # a user: checkpoints and waits PAUSED
    FAIL = "fail"  # it does not report the searcher's metric (require_metric): ends FAILED


@dataclass(frozen=True)
class StudyConfig:
    """An Optuna study: what to optimise and how to sample and prune."""

    name: str
    direction: str  # "maximize" | "minimize"
    sampler: str  # grid | random | tpe | cmaes | qmc
    pruner: str  # none | median | asha | hyperband
    seed: int | None = None
    min_budget: int = 1
    max_budget: int | None = None
    reduction_factor: int = 3
    grid: Mapping[str, tuple[Any, ...]] | None = None


@dataclass(frozen=True)
class AskedTrial:
    backend_id: int  # the storage's id of the Optuna trial
    number: int  # its number within the study
    params: dict[str, Any]


class TellState(StrEnum):
    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"


class SearchBackend(Protocol):
    """Ask-and-tell with early stopping. Every call is durable when it returns."""

    def ask(self, study: StudyConfig, space: SearchSpace) -> AskedTrial: ...

    def pending(self, study: StudyConfig) -> list[AskedTrial]:
        """Trials asked and never told (to adopt those a crash left without a trial row)."""
        ...

    def report(
        self, study: StudyConfig, backend_id: int, points: Sequence[tuple[int, float]]
    ) -> None:
        """Intermediate values by step; a step reported before is ignored."""
        ...

    def should_prune(self, study: StudyConfig, backend_id: int) -> bool: ...

    def tell(
        self, study: StudyConfig, backend_id: int, state: TellState, value: float | None
    ) -> None:
        """End the trial in the study; telling an ended trial again does nothing."""
        ...

    def is_exhausted(self, study: StudyConfig) -> bool:
        """A grid whose every point was asked."""
        ...

    def importance(self, study: StudyConfig) -> dict[str, float]:
        """Hyperparameter importance from the completed trials (empty when too few)."""
        ...


@dataclass(frozen=True)
class SearchRecord:
    experiment_id: int
    state: SearchState
    max_trials: int
    max_concurrent_trials: int
    rng_state: int  # advances with each PBT decision, so a restart does not replay choices
    created_at: float


@dataclass(frozen=True)
class SteeredTrial:
    """What the search and the steering routes keep about one trial."""

    trial_id: int
    experiment_id: int
    backend_id: int | None = None  # the Optuna trial, for trials of a search
    number: int | None = None
    reported_step: int = -1  # the last step told to the backend
    best_value: float | None = None  # best value of the searcher's metric so far
    told: bool = False  # its end was told to the backend
    stop_intent: StopIntent | None = None
    stop_detail: str | None = None
    warm_start_checkpoint_id: int | None = None  # restored when it has no checkpoint of its own
    parent_trial_id: int | None = None  # PBT donor or clone source
    due_step: int = 0  # PBT: the step of its next exploit/explore decision
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchUpdate:
    """Columns of a search to change (:data:`KEEP` leaves one as it is)."""

    state: SearchState | Keep = KEEP
    max_trials: int | Keep = KEEP
    max_concurrent_trials: int | Keep = KEEP
    rng_state: int | Keep = KEEP

    def changes(self) -> dict[str, Any]:
        return changes_of(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class SteeredUpdate:
    """Columns of a steered trial to change (:data:`KEEP` leaves one as it is)."""

    backend_id: int | Keep | None = KEEP
    number: int | Keep | None = KEEP
    reported_step: int | Keep = KEEP
    best_value: float | Keep | None = KEEP
    told: bool | Keep = KEEP
    stop_intent: StopIntent | Keep | None = KEEP
    stop_detail: str | Keep | None = KEEP
    warm_start_checkpoint_id: int | Keep | None = KEEP
    parent_trial_id: int | Keep | None = KEEP
    due_step: int | Keep = KEEP
    extra: dict[str, Any] | Keep = KEEP

    def changes(self) -> dict[str, Any]:
        return changes_of(self)


@dataclass(frozen=True)
class SpecTemplate:
    """A named spec of a tenant (and the code context it was saved with), to submit again."""

    tenant: str
    name: str
    spec_yaml: str
    context_key: str | None
    created_by: str
    created_at: float


class SearchRepository(Protocol):
    def ensure_search(
        self, experiment_id: int, max_trials: int, max_concurrent_trials: int, now: float
    ) -> SearchRecord:
        """The search row of an experiment, created on first use."""
        ...

    def get_search(self, experiment_id: int) -> SearchRecord | None: ...
    def searches_in_states(self, states: Sequence[SearchState]) -> list[SearchRecord]: ...
    def update_search(self, experiment_id: int, update: SearchUpdate) -> SearchRecord: ...

    def add_steered(self, record: SteeredTrial) -> SteeredTrial: ...
    def get_steered(self, trial_id: int) -> SteeredTrial | None: ...
    def list_steered(self, experiment_id: int) -> list[SteeredTrial]: ...
    def update_steered(self, trial_id: int, update: SteeredUpdate) -> SteeredTrial: ...

    def save_template(self, template: SpecTemplate) -> SpecTemplate:
        """Create or replace the tenant's template of that name."""
        ...

    def get_template(self, tenant: str, name: str) -> SpecTemplate | None: ...
    def list_templates(self, tenants: Sequence[str] | None) -> list[SpecTemplate]: ...


class SearchTx(Protocol):
    @property
    def repo(self) -> Repository: ...
    @property
    def search(self) -> SearchRepository: ...


SearchUnitOfWork = Callable[[], AbstractContextManager[SearchTx]]


class TrialHooks(Protocol):
    """What the control loop asks the search and steering side (SearchService implements it)."""

    def tick(self) -> object:
        """One search tick: report metrics, prune, tell, make new trials."""
        ...

    def state_after_stop(self, trial: Trial, default: TrialState) -> TrialState:
        """The state a stopped trial ends in: PRUNED or PAUSED where asked, else ``default``."""
        ...

    def warm_start(self, trial: Trial) -> int | None:
        """The checkpoint a trial with none of its own starts from (PBT donor, clone source)."""
        ...
