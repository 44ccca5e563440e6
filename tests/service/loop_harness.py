"""A control loop on a real SQLite database and artifact store, a fake executor and a clock
the test steps: the loop is driven one tick at a time, with no Ray and no sleeping.

The fake implements our own Executor port (not Ray): attempts are placed, run, exit, get lost
or ignore SIGTERM when the test says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.fixtures.databases import migrate_once
from trainhub.adapters.db import SqlUnitOfWork, make_engine
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.core.resources import Node
from trainhub.core.scheduling import BasePolicy
from trainhub.service.admin import AdminService, authenticate_with
from trainhub.service.control_loop import ControlLoop, LoopConfig, TickReport
from trainhub.service.experiments import ExperimentService
from trainhub.service.ports import (
    ArtifactStore,
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    Principal,
    RankPhase,
    RankStatus,
)
from trainhub.service.records import Attempt, Trial

SIGTERM_EXIT = -15


class SteppedClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class FakeAttempt:
    launch: AttemptLaunch
    phase: AttemptPhase = AttemptPhase.PLACING
    ranks: list[RankStatus] = field(default_factory=list)
    detail: str = "placement group pending: waiting for resources"
    # a script that handles SIGTERM exits at once; one that ignores it runs on
    obeys_sigterm: bool = True
    # what each rank printed so far; a poll returns it from the offset asked for, as Ray's
    # rank workers read their log files
    output: dict[int, bytes] = field(default_factory=dict)


class FakeExecutor:
    """Our Executor port, in memory; records every call it gets."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.attempts: dict[str, FakeAttempt] = {}
        self.launch_error: Exception | None = None
        self.terminated: list[tuple[str, float]] = []
        self.released: list[str] = []
        self.orphans: set[str] = set()
        self.offsets_asked: list[dict[int, int]] = []

    # -- the port --
    def cluster_nodes(self) -> list[Node]:
        return list(self.nodes)

    def launch(self, launch: AttemptLaunch) -> None:
        if self.launch_error is not None:
            raise self.launch_error
        ranks = [RankStatus(r, RankPhase.STARTING) for r in range(len(launch.placement))]
        self.attempts[launch.attempt_key] = FakeAttempt(launch, ranks=ranks)

    def poll(self, attempt_key: str, log_offsets: Mapping[int, int]) -> AttemptStatus:
        attempt = self.attempts.get(attempt_key)
        if attempt is None:
            return AttemptStatus(attempt_key, AttemptPhase.UNKNOWN, detail="not on Ray")
        ranks = tuple(
            replace(r, log_chunk=attempt.output.get(r.rank, b"")[log_offsets.get(r.rank, 0) :])
            for r in attempt.ranks
        )
        self.offsets_asked.append(dict(log_offsets))
        return AttemptStatus(attempt_key, attempt.phase, ranks, attempt.detail)

    def terminate(self, attempt_key: str, grace_s: float = 10.0) -> None:
        self.terminated.append((attempt_key, grace_s))
        attempt = self.attempts.get(attempt_key)
        if attempt is not None and attempt.obeys_sigterm and attempt.phase == AttemptPhase.RUNNING:
            self.exit(attempt_key, [SIGTERM_EXIT] * len(attempt.ranks))

    def release(self, attempt_key: str) -> None:
        self.released.append(attempt_key)
        self.attempts.pop(attempt_key, None)
        self.orphans.discard(attempt_key)

    def live_attempts(self) -> list[str]:
        return sorted(set(self.attempts) | self.orphans)

    # -- what happens on the cluster --
    def run(self, attempt_key: str) -> None:
        attempt = self.attempts[attempt_key]
        attempt.phase = AttemptPhase.RUNNING
        attempt.detail = ""
        attempt.ranks = [RankStatus(r.rank, RankPhase.RUNNING) for r in attempt.ranks]

    def say(self, attempt_key: str, output: Mapping[int, bytes]) -> None:
        """The ranks print ``output`` (rank -> bytes)."""
        attempt = self.attempts[attempt_key]
        for rank, data in output.items():
            attempt.output[rank] = attempt.output.get(rank, b"") + data

    def exit(
        self,
        attempt_key: str,
        codes: Sequence[int],
        output: Mapping[int, bytes] | None = None,
        details: Mapping[int, str] | None = None,
    ) -> None:
        """The ranks exit with ``codes``, having printed ``output`` (rank -> bytes) last;
        ``details``: what the executor knows of a rank's end (rank -> reason, e.g. an OOM)."""
        attempt = self.attempts[attempt_key]
        self.say(attempt_key, output or {})
        attempt.ranks = [
            RankStatus(r.rank, RankPhase.EXITED, code, detail=(details or {}).get(r.rank, ""))
            for r, code in zip(attempt.ranks, codes, strict=True)
        ]
        failed = [r for r in attempt.ranks if r.exit_code]
        attempt.phase = AttemptPhase.EXITED
        attempt.detail = "; ".join(f"rank {r.rank} exited with code {r.exit_code}" for r in failed)

    def lose(self, attempt_key: str, detail: str) -> None:
        attempt = self.attempts[attempt_key]
        attempt.phase = AttemptPhase.LOST
        attempt.detail = detail
        attempt.ranks = [RankStatus(r.rank, RankPhase.LOST) for r in attempt.ranks]


def cpu_nodes(count: int, cpus: float = 8.0, gpus: int = 0) -> list[Node]:
    return [Node(f"node-{i}", gpus, cpus, gpus, cpus) for i in range(count)]


class LoopHarness:
    """A control plane without HTTP: submit through the service, tick the loop by hand."""

    def __init__(
        self,
        root: Path,
        policy: BasePolicy,
        nodes: Sequence[Node],
        config: LoopConfig | None = None,
        db_url: str | None = None,
        store: ArtifactStore | None = None,
        clock: SteppedClock | None = None,
    ) -> None:
        self.clock = clock or SteppedClock()
        self.engine = make_engine(db_url or f"sqlite:///{root / 'trainhub.db'}")
        migrate_once(self.engine)
        self.uow = SqlUnitOfWork(self.engine)
        self.store = store or LocalArtifactStore(root / "artifacts")
        self.executor = FakeExecutor(nodes)
        self.admin = AdminService(self.uow, self.clock)
        issued = self.admin.bootstrap()
        assert issued is not None
        self.admin_secret = issued.secret
        self.principal: Principal = authenticate_with(self.uow, self.clock, issued.secret)
        self.experiments = ExperimentService(self.uow, self.store, self.clock)
        self.loop = ControlLoop(
            self.uow,
            self.executor,
            self.store,
            policy,
            config or LoopConfig("http://127.0.0.1:1"),
            self.clock,
        )

    def close(self) -> None:
        self.engine.dispose()

    def member(self, username: str, tenant: str) -> Principal:
        """A new user, member of ``tenant``, signed in."""
        self.admin.create_user(self.principal, username)
        self.admin.set_membership(self.principal, username, tenant, "member")
        issued = self.admin.issue_token(self.principal, username=username)
        return authenticate_with(self.uow, self.clock, issued.secret)

    def submit(
        self, spec: str, tenant: str | None = None, principal: Principal | None = None
    ) -> int:
        detail = self.experiments.submit(principal or self.principal, spec, None, tenant)
        return detail.trials[0].id

    def tick(self) -> TickReport:
        return self.loop.tick()

    def trial(self, trial_id: int) -> Trial:
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
        assert trial is not None
        return trial

    def attempts(self, trial_id: int) -> list[Attempt]:
        with self.uow() as repo:
            return repo.list_attempts(trial_id)

    def key(self, trial_id: int) -> str:
        """The attempt key of the trial's open attempt."""
        with self.uow() as repo:
            attempt = repo.open_attempt(trial_id)
        assert attempt is not None, f"trial {trial_id} has no open attempt"
        return attempt.key

    def events(self, trial_id: int) -> list[str]:
        with self.uow() as repo:
            return [f"{e.kind}: {e.message}" for e in repo.list_events(trial_id)]
