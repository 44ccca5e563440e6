"""Data migrations on SQLite and PostgreSQL: a database filled at an older revision, upgraded."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, update

from trainhub.adapters.db import SqlUnitOfWork, make_engine
from trainhub.adapters.db.engine import MIGRATIONS_DIR, migrate
from trainhub.adapters.db.models import ExperimentRow


def _downgrade_to(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def test_0012_backfills_the_best_value_of_experiments_that_reported_before_0011(
    db_url: str,
) -> None:
    engine = make_engine(db_url)
    try:
        # filled by today's code, then taken back to 0011 with the best values cleared, as
        # experiments that reported before 0011 were
        migrate(engine)
        uow = SqlUnitOfWork(engine)
        specs = {
            "acc": {"searcher": {"metric": "acc", "mode": "max"}},
            "loss": {"searcher": {"metric": "loss", "mode": "min"}},
            "silent": {"searcher": {"metric": "f1", "mode": "max"}},  # never reported it
            "plain": {"name": "no searcher"},
        }
        ids: dict[str, int] = {}
        with uow() as repo:
            repo.add_tenant("vision", 1.0)
            user = repo.add_user("alice", False, 1.0)
            for name, spec in specs.items():
                experiment = repo.add_experiment("vision", user.id, name, "p", spec, "", 0, 1.0)
                ids[name] = experiment.id
                for t in range(2):
                    trial = repo.add_trial(experiment.id, {}, "normal", 1.0)
                    repo.upsert_metrics(
                        trial.id,
                        1,
                        [
                            (0, {"acc": 0.5 + t / 10, "loss": 2.0 - t}),
                            (1, {"acc": 0.7 + t / 10, "loss": 1.5 - t, "note": 3}),
                        ],
                        2.0,
                    )
            repo.s.execute(update(ExperimentRow).values(best_value=None, best_rank=None))
        _downgrade_to(engine, "0011")
        migrate(engine)  # 0012 and anything later
        with uow() as repo:
            best = {
                name: (
                    repo.s.get_one(ExperimentRow, i).best_value,
                    repo.s.get_one(ExperimentRow, i).best_rank,
                )
                for name, i in ids.items()
            }
        assert best["acc"] == pytest.approx((0.8, -0.8))  # max: the rank sorts best first ascending
        assert best["loss"] == pytest.approx((0.5, 0.5))
        assert best["silent"] == (None, None)
        assert best["plain"] == (None, None)
    finally:
        engine.dispose()


def test_0013_numbers_changes_from_zero_in_a_database_with_trials(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine)
        uow = SqlUnitOfWork(engine)
        with uow() as repo:
            repo.add_tenant("vision", 1.0)
            user = repo.add_user("alice", False, 1.0)
            experiment = repo.add_experiment("vision", user.id, "e", "p", {}, "", 0, 1.0)
            old = repo.add_trial(experiment.id, {}, "normal", 1.0).id
        _downgrade_to(engine, "0012")
        migrate(engine)
        with uow() as repo:
            whole = repo.scheduling_changes(None)
            assert (whole.mark, [r.id for r in whole.records]) == (0, [old])
            assert repo.scheduling_changes(0).records == []  # the trial before 0013: number 0
            new = repo.add_trial(experiment.id, {}, "normal", 2.0).id
        with uow() as repo:
            changed = repo.scheduling_changes(whole.mark)
        assert ([r.id for r in changed.records], changed.mark) == ([new], 1)
    finally:
        engine.dispose()
