"""Trial environments through the control loop, one tick at a time: real SQLite, real uv
(offline, from wheels made on the spot), a fake executor (tests/service/loop_harness.py)."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.wheels import make_wheel
from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.adapters.db.environment_store import SqlEnvironmentStore
from trainhub.adapters.envs.uv import UvEnvironments
from trainhub.core.environments import EnvironmentState
from trainhub.core.errors import Conflict, InvalidSpec, NotFound, PermissionDenied
from trainhub.core.scheduling.fifo import FifoPolicy
from trainhub.core.states import TrialState
from trainhub.service.environments import EnvironmentRecord, EnvironmentService
from trainhub.service.ports import Principal


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "tinypkg", "1.0", "GREETING = 'hello'")
    make_wheel(folder, "bigpkg", "2.0", padding=200_000)
    return folder


class Rig:
    def __init__(self, root: Path, wheels: Path, cache_bytes: int | None = None) -> None:
        self.harness = LoopHarness(root, FifoPolicy(), cpu_nodes(2))
        self.builder = UvEnvironments(
            root / "envs", index_args=["--no-index", "--find-links", str(wheels)]
        )
        self.store = SqlEnvironmentStore(self.harness.engine)
        self.service = EnvironmentService(
            self.harness.uow, self.store, self.builder, self.harness.clock, cache_bytes
        )
        self.harness.loop.environments = self.service
        self.harness.experiments.check_environment = self.service.check_request

    def submit(self, packages: list[str], name: str = "env") -> int:
        spec = json.dumps(
            {
                "name": name,
                "entrypoint": "python -m tinypkg",
                "resources": {"workers": 1, "cpus_per_worker": 1},
                "environment": {"packages": packages},
            }
        )
        return self.harness.submit(spec)

    def record(self, packages: list[str]) -> EnvironmentRecord:
        (found,) = [r for r in self.store.list(None) if r.requirements == packages]
        return found

    def settle(self, timeout_s: float = 120.0) -> None:
        """Wait until no build is in flight."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.service.building():
                return
            time.sleep(0.05)
        raise AssertionError("a build did not end")

    def complete(self, trial_id: int) -> None:
        key = self.harness.key(trial_id)
        self.harness.executor.run(key)
        self.harness.tick()
        self.harness.executor.exit(key, {0: 0})
        self.harness.tick()
        assert self.harness.trial(trial_id).state == TrialState.COMPLETED


@pytest.fixture
def rig(tmp_path: Path, wheels: Path) -> Iterator[Rig]:
    made = Rig(tmp_path, wheels)
    yield made
    made.service.close()
    made.harness.close()


def test_a_trial_waits_in_the_queue_while_its_environment_builds_then_runs_in_it(
    rig: Rig,
) -> None:
    trial_id = rig.submit(["tinypkg==1.0"])
    rig.harness.tick()
    trial = rig.harness.trial(trial_id)
    assert trial.state == TrialState.QUEUED
    assert "building its environment" in (trial.pending_reason or "")
    assert rig.harness.attempts(trial_id) == []  # no attempt, no slot while uv runs
    rig.settle()
    rig.harness.tick()
    assert rig.harness.trial(trial_id).state == TrialState.SCHEDULED
    (attempt,) = rig.harness.executor.attempts.values()
    path = attempt.launch.environment_dir
    assert path is not None
    assert path == rig.builder.path(rig.record(["tinypkg==1.0"]).key or "")
    site = next(Path(path).glob("lib/python*/site-packages"))
    assert (site / "tinypkg" / "__init__.py").exists()
    assert not os.access(site / "tinypkg" / "__init__.py", os.W_OK) or os.geteuid() == 0
    record = rig.record(["tinypkg==1.0"])
    assert (record.num_builds, record.num_uses) == (1, 1)
    assert record.packages == ["tinypkg==1.0"]
    assert any("built for it" in e for e in rig.harness.events(trial_id))

    rig.complete(trial_id)
    second = rig.submit(["tinypkg==1.0"], name="again")
    rig.harness.tick()  # ready at once: started in the same tick, no build
    assert rig.harness.trial(second).state == TrialState.SCHEDULED
    record = rig.record(["tinypkg==1.0"])
    assert (record.num_builds, record.num_uses) == (1, 2)
    assert any("cached" in e for e in rig.harness.events(second))


def test_two_experiments_asking_together_build_once(rig: Rig) -> None:
    first, second = rig.submit(["tinypkg==1.0"], "a"), rig.submit(["tinypkg==1.0"], "b")
    rig.harness.tick()
    rig.settle()
    rig.harness.tick()
    assert rig.harness.trial(first).state == TrialState.SCHEDULED
    assert rig.harness.trial(second).state == TrialState.SCHEDULED
    record = rig.record(["tinypkg==1.0"])
    assert (record.num_builds, record.num_uses) == (1, 2)


def test_two_builders_of_one_environment_install_it_once(tmp_path: Path, wheels: Path) -> None:
    root = tmp_path / "shared"
    builders = [
        UvEnvironments(root, index_args=["--no-index", "--find-links", str(wheels)])
        for _ in range(2)
    ]
    base = builders[0].base()
    results = []

    def build(builder: UvEnvironments) -> None:
        results.append(builder.install("k" * 64, ["tinypkg==1.0"], base))

    threads = [threading.Thread(target=build, args=(b,)) for b in builders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(r.built for r in results) == [False, True]  # the second waited, then reused
    assert results[0].path == results[1].path


def test_a_package_that_does_not_resolve_fails_the_trial_once(rig: Rig) -> None:
    trial_id = rig.submit(["nosuchpkg==3.0"])
    rig.harness.tick()
    rig.settle()
    rig.harness.tick()
    trial = rig.harness.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert "nosuchpkg" in (trial.message or "")
    assert trial.num_attempts == 0
    assert trial.num_restarts == 0
    assert rig.harness.attempts(trial_id) == []
    record = rig.record(["nosuchpkg==3.0"])
    assert record.state == EnvironmentState.FAILED
    assert "nosuchpkg" in record.error
    # another experiment with the same request tries again (the index may answer now)
    again = rig.submit(["nosuchpkg==3.0"], "again")
    rig.harness.tick()
    assert "building" in (rig.harness.trial(again).pending_reason or "")
    rig.settle()


def test_least_recently_used_environments_are_evicted_past_the_cap(
    tmp_path: Path, wheels: Path
) -> None:
    rig = Rig(tmp_path, wheels, cache_bytes=1)  # every environment is over the cap
    try:
        first = rig.submit(["tinypkg==1.0"], "a")
        rig.harness.tick()
        rig.settle()
        rig.harness.tick()
        rig.complete(first)
        old_key = rig.record(["tinypkg==1.0"]).key
        assert old_key is not None
        second = rig.submit(["bigpkg==2.0"], "b")
        rig.harness.tick()
        rig.settle()
        rig.harness.tick()
        # the older one, no longer needed, went; the new one, needed by a trial, stayed
        assert [r.requirements for r in rig.store.list(None)] == [["bigpkg==2.0"]]
        assert rig.builder.path(old_key) is None
        assert rig.harness.trial(second).state == TrialState.SCHEDULED
    finally:
        rig.service.close()
        rig.harness.close()


def test_admins_remove_environments_no_trial_needs(rig: Rig) -> None:
    trial_id = rig.submit(["tinypkg==1.0"])
    rig.harness.tick()
    rig.settle()
    rig.harness.tick()
    key = rig.record(["tinypkg==1.0"]).key
    assert key is not None
    admin = rig.harness.principal
    member = Principal(user_id=99, username="m", roles={"default": "member"})
    with pytest.raises(PermissionDenied):
        rig.service.remove(member, key[:12])
    with pytest.raises(Conflict):  # its trial is scheduled
        rig.service.remove(admin, key[:12])
    rig.complete(trial_id)
    with pytest.raises(NotFound):
        rig.service.remove(admin, "abcdef0123")
    (removed,) = rig.service.remove(admin, key[:12])
    assert removed.key == key
    assert rig.builder.path(key) is None
    assert rig.store.list(None) == []
    assert [r.key for r in rig.service.list_environments(member)] == []


def test_submit_refuses_a_requirements_file_missing_from_the_code(rig: Rig) -> None:
    spec = json.dumps(
        {"name": "x", "entrypoint": "python train.py", "environment": {"requirements": "req.txt"}}
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(InvalidSpec) as raised:
        rig.harness.experiments.submit(rig.harness.principal, spec, buffer.getvalue(), None)
    (error,) = raised.value.errors
    assert error.path == "environment.requirements"
    assert "'req.txt' is not in the submitted code" in error.message
