"""A control plane for search tests: real SQLite (ours and Optuna's), a fake executor, a stepped
clock. The fake executor runs no processes: the test decides what each trial reports and when it
exits, and the control loop, the search tick and the scheduler run for real, one tick at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.databases import migrate_once
from trainhub.adapters.db import SqlUnitOfWork, make_engine
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.core.resources import Node
from trainhub.core.scheduling.factory import create_policy
from trainhub.service.admin import AdminService, authenticate_with
from trainhub.service.control_loop import ControlLoop, LoopConfig
from trainhub.service.experiments import ExperimentService
from trainhub.service.ports import (
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    Principal,
    RankPhase,
    RankStatus,
)
from trainhub.service.search import SearchService
from trainhub.service.steering import SteeringService
from trainhub.service.tracking import TrackingService


@dataclass
class SteppedClock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeAttempt:
    launch: AttemptLaunch
    exit_code: int | None = None  # None: running


@dataclass
class FakeExecutor:
    """One node with ``cpus`` CPUs; attempts run until the test (or terminate) ends them."""

    cpus: int = 8
    attempts: dict[str, FakeAttempt] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)

    def cluster_nodes(self) -> list[Node]:
        return [Node("node-1", 0, float(self.cpus), 0, float(self.cpus))]

    def launch(self, launch: AttemptLaunch) -> None:
        self.attempts[launch.attempt_key] = FakeAttempt(launch)

    def poll(self, attempt_key: str, log_offsets: Mapping[int, int]) -> AttemptStatus:
        attempt = self.attempts.get(attempt_key)
        if attempt is None or attempt_key in self.released:
            return AttemptStatus(attempt_key, AttemptPhase.UNKNOWN)
        if attempt.exit_code is None:
            return AttemptStatus(
                attempt_key, AttemptPhase.RUNNING, (RankStatus(0, RankPhase.RUNNING),)
            )
        return AttemptStatus(
            attempt_key,
            AttemptPhase.EXITED,
            (RankStatus(0, RankPhase.EXITED, attempt.exit_code),),
        )

    def terminate(self, attempt_key: str, grace_s: float = 10.0) -> None:
        attempt = self.attempts.get(attempt_key)
        if attempt is not None and attempt.exit_code is None:
            attempt.exit_code = -15

    def release(self, attempt_key: str) -> None:
        self.released.add(attempt_key)

    def live_attempts(self) -> list[str]:
        return [k for k in self.attempts if k not in self.released]

    # -- what the test does to the "processes"
    def running(self) -> dict[int, FakeAttempt]:
        """The live attempt of each trial, by trial id."""
        return {
            a.launch.trial_id: a
            for k, a in self.attempts.items()
            if k not in self.released and a.exit_code is None
        }

    def exit(self, trial_id: int, code: int = 0) -> None:
        self.running()[trial_id].exit_code = code


@dataclass
class Rig:
    url: str
    root: Path
    clock: SteppedClock
    executor: FakeExecutor
    admin: Principal
    experiments: ExperimentService
    tracking: TrackingService
    search: SearchService
    steering: SteeringService
    loop: ControlLoop
    backend: OptunaSearch

    def tick(self) -> None:
        self.clock.now += 1.0
        self.loop.tick()

    def restart(self) -> Rig:
        """A new control plane process on the same database and the same running trials."""
        return build_rig(self.url, self.root, self.executor, self.clock, self.admin)


def build_rig(
    url: str,
    root: Path,
    executor: FakeExecutor | None = None,
    clock: SteppedClock | None = None,
    admin: Principal | None = None,
) -> Rig:
    engine = make_engine(url)
    migrate_once(engine)
    uow = SqlUnitOfWork(engine)
    search_uow = SqlSearchUnitOfWork(engine)
    store = LocalArtifactStore(root / "artifacts")
    clock = clock or SteppedClock()
    executor = executor or FakeExecutor()
    backend = OptunaSearch.for_database(url)
    experiments = ExperimentService(uow, store, clock)
    search = SearchService(search_uow, backend, store, clock)
    loop = ControlLoop(
        uow,
        executor,
        store,
        create_policy("fifo"),
        LoopConfig("http://127.0.0.1:1"),
        clock,
        hooks=search,
    )
    if admin is None:
        issued = AdminService(uow, clock).bootstrap()
        assert issued is not None
        admin = authenticate_with(uow, clock, issued.secret)
    return Rig(
        url,
        root,
        clock,
        executor,
        admin,
        experiments,
        TrackingService(uow, store, clock),
        search,
        SteeringService(search_uow, experiments, store, backend, clock),
        loop,
        backend,
    )
