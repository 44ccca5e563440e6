"""The Optuna backend driven with plain values: every sampler, every pruner, both databases."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainhub.adapters.optuna_search import OptunaSearch, optuna_storage_url
from trainhub.core.search_space import parse_space
from trainhub.service.search_ports import StudyConfig, TellState

SPACE = parse_space(
    {
        "x": {"type": "float", "low": -2.0, "high": 2.0, "step": 0.5},
        "n": {"type": "int", "low": 1, "high": 3},
        "kind": {"type": "categorical", "choices": ["a", "b"]},
    }
)


def test_storage_beside_our_tables() -> None:
    assert optuna_storage_url("sqlite:////srv/th/trainhub.db")[0] == (
        "sqlite:////srv/th/trainhub-optuna.db"
    )
    url, kwargs = optuna_storage_url("postgresql://u@db/trainhub")
    assert url == "postgresql+psycopg://u@db/trainhub"
    assert kwargs["connect_args"] == {"options": "-csearch_path=optuna"}


@pytest.mark.parametrize("sampler", ["grid", "random", "tpe", "cmaes", "qmc"])
def test_every_sampler_asks_points_of_the_space(sampler: str, tmp_path: Path) -> None:
    backend = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    study = StudyConfig(f"s-{sampler}", "minimize", sampler, "none", seed=1, grid=SPACE.grid())
    seen = set()
    for _ in range(6):
        asked = backend.ask(study, SPACE)
        assert asked.params["x"] in (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
        assert asked.params["n"] in (1, 2, 3)
        assert asked.params["kind"] in ("a", "b")
        seen.add((asked.params["x"], asked.params["n"], asked.params["kind"]))
        backend.tell(study, asked.backend_id, TellState.COMPLETE, asked.params["x"] ** 2)
    if sampler == "grid":
        assert len(seen) == 6  # a grid never repeats a point while points are left
    assert not backend.is_exhausted(study)
    assert backend.pending(study) == []


def test_grid_is_exhausted_after_its_last_point(tmp_path: Path) -> None:
    space = parse_space({"n": {"type": "int", "low": 1, "high": 3}})
    backend = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    study = StudyConfig("grid", "maximize", "grid", "none", grid=space.grid())
    values = sorted(backend.ask(study, space).params["n"] for _ in range(3))
    assert values == [1, 2, 3]
    assert backend.is_exhausted(study)


@pytest.mark.parametrize("pruner", ["median", "asha", "hyperband"])
def test_every_pruner_stops_a_poor_curve(pruner: str, tmp_path: Path) -> None:
    backend = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    study = StudyConfig(
        f"p-{pruner}", "maximize", "random", pruner, seed=0, min_budget=1, max_budget=9
    )
    for quality in (0.9, 0.8, 0.85, 0.95, 0.7):  # median waits for 5  # good trials, told complete
        asked = backend.ask(study, SPACE)
        for step in range(1, 10):  # as the search tick does: report, then ask the pruner
            backend.report(study, asked.backend_id, [(step, quality * step / 9)])
            backend.should_prune(study, asked.backend_id)
        backend.tell(study, asked.backend_id, TellState.COMPLETE, quality)
    poor = backend.ask(study, SPACE)
    pruned_at = None
    for step in range(1, 10):
        backend.report(study, poor.backend_id, [(step, 0.01 * step / 9)])
        if backend.should_prune(study, poor.backend_id):
            pruned_at = step
            break
    assert pruned_at is not None
    backend.tell(study, poor.backend_id, TellState.PRUNED, None)
    backend.tell(study, poor.backend_id, TellState.PRUNED, None)  # telling twice is harmless


def test_nop_pruner_never_prunes_and_reports_are_idempotent(tmp_path: Path) -> None:
    backend = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    study = StudyConfig("nop", "maximize", "random", "none", seed=0)
    asked = backend.ask(study, SPACE)
    backend.report(study, asked.backend_id, [(1, 0.0), (2, 0.0)])
    backend.report(study, asked.backend_id, [(2, 0.5)])  # again after a crash: ignored
    assert not backend.should_prune(study, asked.backend_id)
    # a new process (a restarted control plane) sees the same pending trial
    again = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    (pending,) = again.pending(study)
    assert pending.backend_id == asked.backend_id
    assert pending.params == asked.params


def test_importance_after_some_trials(tmp_path: Path) -> None:
    backend = OptunaSearch.for_database(f"sqlite:///{tmp_path / 'th.db'}")
    study = StudyConfig("imp", "minimize", "random", "none", seed=0)
    assert backend.importance(study) == {}
    for _ in range(8):
        asked = backend.ask(study, SPACE)
        backend.tell(study, asked.backend_id, TellState.COMPLETE, asked.params["x"] ** 2)
    weights = backend.importance(study)
    assert set(weights) == {"x", "n", "kind"}
    assert max(weights, key=lambda k: weights[k]) == "x"
