"""The search backend on Optuna: ask-and-tell, its samplers and pruners, its RDB storage.

Optuna's storage lives beside our tables (ADR 0010): on PostgreSQL in the schema ``optuna`` of
the same database; on SQLite in a sibling file (``trainhub.db`` -> ``trainhub-optuna.db``),
because SQLite has no schemas and Optuna's table names (``trials``, ``alembic_version``) are
ours too. Every call commits in Optuna's storage before it returns, so a restarted control plane
loads the same studies and trials.

One study per search experiment; :class:`optuna.Study` objects are cached per study name (the
sampler's in-memory state, such as TPE's random generator, is rebuilt from storage after a
restart). Importing this module imports Optuna: only the composition root does it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalChoiceType
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from trainhub.adapters import optuna_speedups
from trainhub.adapters.db.engine import normalize_url
from trainhub.adapters.host_files import create_private
from trainhub.core.search_space import CategoricalParam, FloatParam, IntParam, Scalar, SearchSpace
from trainhub.service.search_ports import AskedTrial, StudyConfig, TellState

log = logging.getLogger(__name__)
OPTUNA_SCHEMA = "optuna"
MEDIAN_STARTUP_TRIALS = 5
TPE_OPTIONS: dict[str, Any] = {}


def optuna_storage_url(db_url: str) -> tuple[str, dict[str, Any]]:
    """The storage URL and engine arguments of Optuna's tables for our database URL."""
    url = normalize_url(db_url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if not database or database == ":memory:":
            return "sqlite://", {}
        path = Path(database)
        sibling = path.with_name(f"{path.stem}-optuna{path.suffix or '.db'}")
        return f"sqlite:///{sibling}", {"connect_args": {"timeout": 30, "check_same_thread": False}}
    return url, {
        "connect_args": {"options": f"-csearch_path={OPTUNA_SCHEMA}"},
        "pool_pre_ping": True,
    }


def prepare_optuna_storage(db_url: str) -> optuna.storages.RDBStorage:
    """Create the schema (PostgreSQL) or WAL file (SQLite) and open Optuna's storage."""
    url, kwargs = optuna_storage_url(db_url)
    if url.startswith("sqlite:///"):
        # 0600 before SQLite creates it (its -wal and -shm copy the mode), as the main one
        create_private(Path(url.removeprefix("sqlite:///")))
        sqlite = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            sqlite.execute("PRAGMA journal_mode=WAL")  # persists in the file
        finally:
            sqlite.close()
    elif not url.startswith("sqlite"):
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
        finally:
            engine.dispose()
    with _quiet():
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    if url.startswith("sqlite:///"):
        # WAL with synchronous=NORMAL, as our own database: a commit does not wait for fsync
        # (an ask is a dozen commits); a power cut may lose the last commits, never corrupt.
        event.listen(storage.engine, "connect", _sqlite_pragmas)
        storage.engine.dispose()
    return storage


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Optuna warns about experimental features and ignored re-reports; we decided on both."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message=".*already reported.*")
        warnings.filterwarnings("ignore", message=".*independent sampl.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
        yield


class _OptunaSuggest:
    """Answers the space's questions with an Optuna trial (define-by-run, conditionals too)."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial

    def suggest_float(self, param: FloatParam) -> float:
        return self.trial.suggest_float(
            param.name, param.low, param.high, log=param.log, step=param.step
        )

    def suggest_int(self, param: IntParam) -> int:
        step = 1 if param.log else param.step
        return self.trial.suggest_int(param.name, param.low, param.high, log=param.log, step=step)

    def suggest_categorical(self, param: CategoricalParam) -> Scalar:
        choices: list[CategoricalChoiceType] = list(param.values)
        return self.trial.suggest_categorical(param.name, choices)


def _sampler(config: StudyConfig) -> optuna.samplers.BaseSampler:
    seed = config.seed
    if config.sampler == "grid":
        assert config.grid is not None, "a grid search needs the grid"
        grid = {name: list(values) for name, values in config.grid.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if config.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **TPE_OPTIONS)
    if config.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if config.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"unknown sampler {config.sampler!r}")


def _pruner(config: StudyConfig) -> optuna.pruners.BasePruner:
    if config.pruner == "none":
        return optuna.pruners.NopPruner()
    if config.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=config.min_budget
        )
    if config.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=config.min_budget,
            reduction_factor=config.reduction_factor,
            min_early_stopping_rate=0,
        )
    if config.pruner == "hyperband":
        assert config.max_budget is not None
        return optuna.pruners.HyperbandPruner(
            min_resource=config.min_budget,
            max_resource=config.max_budget,
            reduction_factor=config.reduction_factor,
        )
    raise ValueError(f"unknown pruner {config.pruner!r}")


_TELL = {
    TellState.COMPLETE: optuna.trial.TrialState.COMPLETE,
    TellState.PRUNED: optuna.trial.TrialState.PRUNED,
    TellState.FAIL: optuna.trial.TrialState.FAIL,
}


class OptunaSearch:
    """:class:`~trainhub.service.search_ports.SearchBackend` on an Optuna RDB storage."""

    def __init__(self, storage: optuna.storages.BaseStorage) -> None:
        self.storage = storage
        self._studies: dict[str, optuna.Study] = {}
        # live trials by storage id: a report or a prune decision reuses the trial's cached
        # state instead of reading it again (this process is the studies' only writer)
        self._trials: dict[int, optuna.Trial] = {}
        self._lock = threading.Lock()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna_speedups.install()  # TPE's log-CDF in C: about 2.5x less CPU an ask

    @classmethod
    def for_database(cls, db_url: str) -> OptunaSearch:
        return cls(prepare_optuna_storage(db_url))

    def _study(self, config: StudyConfig) -> optuna.Study:
        with self._lock:
            study = self._studies.get(config.name)
            if study is None:
                with _quiet():
                    study = optuna.create_study(
                        storage=self.storage,
                        study_name=config.name,
                        direction=optuna.study.StudyDirection[config.direction.upper()],
                        sampler=_sampler(config),
                        pruner=_pruner(config),
                        load_if_exists=True,
                    )
                self._studies[config.name] = study
            return study

    def ask(self, study: StudyConfig, space: SearchSpace) -> AskedTrial:
        optuna_study = self._study(study)
        with _quiet():
            trial = optuna_study.ask()
            params = space.sample(_OptunaSuggest(trial))
        self._trials[trial._trial_id] = trial
        return AskedTrial(trial._trial_id, trial.number, params)

    def pending(self, study: StudyConfig) -> list[AskedTrial]:
        running = self._study(study).get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)
        )
        return [AskedTrial(t._trial_id, t.number, dict(t.params)) for t in running]

    def _trial(self, study: StudyConfig, backend_id: int) -> optuna.Trial:
        trial = self._trials.get(backend_id)
        if trial is None:
            trial = optuna.Trial(self._study(study), backend_id)
            self._trials[backend_id] = trial
        return trial

    def report(
        self, study: StudyConfig, backend_id: int, points: Sequence[tuple[int, float]]
    ) -> None:
        if not points:
            return
        trial = self._trial(study, backend_id)
        with _quiet():
            for step, value in points:
                trial.report(value, step)

    def should_prune(self, study: StudyConfig, backend_id: int) -> bool:
        with _quiet():
            return bool(self._trial(study, backend_id).should_prune())

    def tell(
        self, study: StudyConfig, backend_id: int, state: TellState, value: float | None
    ) -> None:
        optuna_study = self._study(study)
        self._trials.pop(backend_id, None)
        number = self.storage.get_trial_number_from_id(backend_id)
        with _quiet():
            if state == TellState.COMPLETE and value is not None:
                optuna_study.tell(number, value, skip_if_finished=True)
            else:
                target = TellState.FAIL if state == TellState.COMPLETE else state
                optuna_study.tell(number, state=_TELL[target], skip_if_finished=True)

    def is_exhausted(self, study: StudyConfig) -> bool:
        """Every point of a grid was asked (Optuna's own check waits for them to finish, and
        meanwhile hands out running points again)."""
        if study.sampler != "grid" or study.grid is None:
            return False
        size = math.prod(len(values) for values in study.grid.values())
        return len(self._study(study).get_trials(deepcopy=False)) >= size

    def importance(self, study: StudyConfig) -> dict[str, float]:
        optuna_study = self._study(study)
        complete = optuna_study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
        )
        if len(complete) < 2:
            return {}
        try:
            with _quiet():
                return {
                    k: float(v)
                    for k, v in optuna.importance.get_param_importances(optuna_study).items()
                }
        except (ValueError, RuntimeError) as exc:  # e.g. a parameter that never varied
            log.info("no importance for %s: %s", study.name, exc)
            return {}
