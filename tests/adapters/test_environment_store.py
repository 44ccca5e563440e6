"""The environment records' store on SQLite and PostgreSQL: one contract, both backends."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
from trainhub.adapters.db.environment_store import SqlEnvironmentStore
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.core.environments import EnvironmentState
from trainhub.core.states import TrialState
from trainhub.service.admin import AdminService, authenticate_with
from trainhub.service.clock import system_clock
from trainhub.service.experiments import ExperimentService
from trainhub.service.records import TrialUpdate
from trainhub.service.trial_writes import write_trial


def test_records_counts_links_and_what_is_in_use(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    try:
        uow = SqlUnitOfWork(engine)
        admin = AdminService(uow, system_clock)
        issued = admin.bootstrap()
        assert issued is not None
        principal = authenticate_with(uow, system_clock, issued.secret)
        experiments = ExperimentService(uow, LocalArtifactStore(tmp_path / "a"), system_clock)
        spec = json.dumps({"name": "e", "entrypoint": "python -m x"})
        detail = experiments.submit(principal, spec, None, None)
        experiment_id, trial_id = detail.experiment.id, detail.trials[0].id

        store = SqlEnvironmentStore(engine)
        assert store.get("r1") is None
        store.begin("r1", ["a==1"], 10.0)
        store.begin("r2", ["b==2"], 11.0)
        assert store.get("r1").state == EnvironmentState.BUILDING  # type: ignore[union-attr]
        store.finish("r1", "k1", ["a==1"], 1234, "log", 0.5, True, 12.0)
        store.finish("r1", "k1", ["a==1"], 1234, "log", 0.5, False, 13.0)  # found installed
        store.fail("r2", "no such package b", "uv said so", 14.0)
        store.use("r1", ["n2", "n1"], 15.0)
        store.use("r1", ["n1"], 16.0)
        one = store.get("r1")
        assert one is not None
        assert (one.key, one.state, one.num_builds, one.num_uses) == (
            "k1",
            EnvironmentState.READY,
            1,
            2,
        )
        assert (one.size_bytes, one.last_used_at, one.nodes) == (1234, 16.0, ["n1", "n2"])
        two = store.get("r2")
        assert two is not None
        assert (two.state, two.error) == (EnvironmentState.FAILED, "no such package b")

        store.link(experiment_id, "r1")
        assert store.of_experiment(experiment_id) == one
        assert [r.request_key for r in store.list({"default"})] == ["r1"]
        assert [r.request_key for r in store.list({"elsewhere"})] == []
        assert [r.request_key for r in store.list(None)] == ["r1", "r2"]
        assert store.in_use() == {"r1"}  # its trial is queued
        with uow() as repo:
            write_trial(
                repo, trial_id, TrialUpdate(state=TrialState.CANCELED), current=TrialState.QUEUED
            )
        assert store.in_use() == set()
        store.delete(["r1", "r2"])
        assert store.list(None) == []
        assert store.of_experiment(experiment_id) is None
    finally:
        engine.dispose()


def test_nodes_that_install_at_once_are_each_counted(db_url: str) -> None:
    """Each node of a placement installs an environment in a thread of its own and counts
    its build: a count read, raised and written back lost one of two at once (a CI run
    saw num_builds 1 for two nodes)."""
    engine = make_engine(db_url)
    migrate(engine)
    try:
        store = SqlEnvironmentStore(engine)
        store.begin("r", ["a==1"], 1.0)
        start = threading.Barrier(4)

        def install(node: int) -> None:
            start.wait()
            for _ in range(10):
                store.finish("r", "k", ["a==1"], 10, f"node {node}", 0.1, True, 2.0)
                store.use("r", [f"n{node}"], 3.0)

        threads = [threading.Thread(target=install, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        record = store.get("r")
        assert record is not None
        assert (record.num_builds, record.num_uses) == (40, 40)
    finally:
        engine.dispose()
