"""The layer-alert store (migration 0008), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from tests.adapters.test_repository_contract import seed, uow
from trainhub.adapters.db import SqlUnitOfWork
from trainhub.core.layer_alerts import AlertKind, LayerAlert

__all__ = ["uow"]  # the contract's fixture


def alert(step: int, layer: str = "fc1", kind: AlertKind = AlertKind.DEAD_LAYER) -> LayerAlert:
    return LayerAlert(kind, layer, step, step / 100, f"{layer} at {step}")


def test_one_row_per_kind_and_layer_with_first_and_last_step(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        repo.record_layer_alerts(trial_id, [alert(20), alert(10), alert(30, "fc2")], 1.0)
    with uow() as repo:
        repo.record_layer_alerts(trial_id, [alert(40), alert(5, "fc2")], 2.0)  # 5: a late retry
        repo.record_layer_alerts(trial_id, [alert(40)], 3.0)  # a retried batch
        repo.record_layer_alerts(trial_id, [], 3.0)
    with uow() as repo:
        fc2, fc1 = repo.list_layer_alerts(trial_id)
        assert (fc1.layer, fc1.first_step, fc1.last_step) == ("fc1", 10, 40)
        assert (fc1.value, fc1.message, fc1.first_at, fc1.last_at) == (0.1, "fc1 at 10", 1.0, 3.0)
        assert (fc2.first_step, fc2.last_step, fc2.message) == (5, 30, "fc2 at 5")
        assert [a.layer for a in repo.list_layer_alerts(trial_id, limit=1)] == ["fc2"]
        repo.record_layer_alerts(trial_id, [alert(50, "fc1", AlertKind.NONFINITE)], 4.0)
        assert len(repo.list_layer_alerts(trial_id)) == 3
