"""The WriteQuotaStore contract (issue 24), against SQLite and PostgreSQL alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adapters.test_repository_contract import seed
from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate


@pytest.fixture
def uow(db_url: str) -> Iterator[SqlUnitOfWork]:
    engine = make_engine(db_url)
    migrate(engine)
    yield SqlUnitOfWork(engine)
    engine.dispose()


def test_metric_counts_and_disk_bytes_are_kept_with_the_trial(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        repo.add_metric_counts(trial_id, 1000, 0)
        repo.add_metric_counts(trial_id, 500, 20)
        repo.add_metric_counts(trial_id, 0, 0)
        target = repo.metrics_target(trial_id, 1)
        assert target is not None
        assert target.metric_points == 1500
        repo.record_disk_bytes({trial_id: 3 * 1024**3})
        repo.record_disk_bytes({})
    with uow() as repo:
        trial = repo.get_trial(trial_id)
        assert trial is not None
        assert (trial.metric_points, trial.metric_points_dropped) == (1500, 20)
        assert trial.disk_bytes == 3 * 1024**3  # past 32 bits
        assert repo.disk_bytes_by_tenant() == {"vision": 3 * 1024**3}
        target = repo.metrics_target(trial_id, 1)
        assert target is not None
        assert (target.disk_bytes, target.max_trial_storage_bytes) == (3 * 1024**3, None)
        assert repo.checkpoint_bytes_of([trial_id]) == {}
        kept = repo.add_checkpoint(trial_id, "u1", 1, 1, {}, "k1", 10, 3.0)
        repo.add_checkpoint(trial_id, "u2", 2, 1, {}, "k2", 32, 4.0)
        repo.mark_checkpoint_deleted(kept.id)
        assert repo.checkpoint_bytes_of([trial_id, trial_id + 1]) == {trial_id: 32}
        assert repo.checkpoint_bytes_of([]) == {}
        repo.record_disk_bytes({trial_id: 0})
        assert repo.disk_bytes_by_tenant() == {}
