"""Trial environments installed on the nodes that run them, where no folder is shared (ADR
0034), through the control loop one tick at a time: real SQLite, real uv (offline, from wheels
made on the spot), a fake executor (tests/service/loop_harness.py). Each "node" installs into
a cache folder of its own (``FolderNodes``, the NodeInstaller port on this machine's folders;
the Ray one runs the same builder in a task on the node: tests/adapters/test_node_environments.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.fixtures.wheels import make_wheel
from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.adapters.db.environment_store import SqlEnvironmentStore
from trainhub.adapters.envs.uv import UvEnvironments
from trainhub.core.environments import BaseIdentity
from trainhub.core.scheduling.fifo import FifoPolicy
from trainhub.core.states import TrialState
from trainhub.service.environments import BuildFailed, EnvironmentService, Installed, NodeLost


class FolderNodes:
    """Each node's cache is ``root/NODE``; ``lose`` makes a node's next install fail as a
    node that went away does; ``other_base`` nodes have a Python environment of their own."""

    def __init__(self, root: Path, wheels: Path) -> None:
        self.root = root
        self.index = ["--no-index", "--find-links", str(wheels)]
        self.calls: list[str] = []
        self.lose: set[str] = set()
        self.other_base: set[str] = set()
        self.removed: list[str] = []
        self.lock = threading.Lock()

    def builder(self, node_id: str) -> UvEnvironments:
        return UvEnvironments(self.root / node_id, index_args=self.index)

    def install(
        self, node_id: str, key: str, packages: Sequence[str], base: BaseIdentity
    ) -> Installed:
        with self.lock:
            self.calls.append(node_id)
            if node_id in self.lose:
                self.lose.discard(node_id)
                raise NodeLost(f"node {node_id} died")
        builder = self.builder(node_id)
        here = builder.base()
        if node_id in self.other_base or here.identity != base:
            raise BuildFailed(f"node {node_id}'s Python environment is not the control plane's", "")
        return builder.install(key, packages, here)

    def remove(self, key: str) -> None:
        self.removed.append(key)
        for node in self.root.iterdir():
            UvEnvironments(node).remove(key)


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "tinypkg", "1.0", "GREETING = 'hello'")
    return folder


class Rig:
    def __init__(self, root: Path, wheels: Path) -> None:
        self.harness = LoopHarness(root, FifoPolicy(), cpu_nodes(2))
        self.nodes = FolderNodes(root / "nodes", wheels)
        # the control plane resolves only: its own cache folder stays empty
        self.here = UvEnvironments(
            root / "control-plane-envs", index_args=["--no-index", "--find-links", str(wheels)]
        )
        self.store = SqlEnvironmentStore(self.harness.engine)
        self.service = EnvironmentService(
            self.harness.uow, self.store, self.here, self.harness.clock, nodes=self.nodes
        )
        self.harness.loop.environments = self.service
        self.harness.experiments.check_environment = self.service.check_request

    def submit(self, name: str, workers: int, cpus: int) -> int:
        spec = {
            "name": name,
            "entrypoint": "python -m tinypkg",
            "resources": {"workers": workers, "cpus_per_worker": cpus},
            "environment": {"packages": ["tinypkg==1.0"]},
        }
        return self.harness.submit(json.dumps(spec))

    def settle(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.service.building():
                return
            time.sleep(0.05)
        raise AssertionError("a build did not end")

    def complete(self, trial_id: int, ranks: int) -> None:
        key = self.harness.key(trial_id)
        self.harness.executor.run(key)
        self.harness.tick()
        self.harness.executor.exit(key, [0] * ranks)
        self.harness.tick()
        assert self.harness.trial(trial_id).state == TrialState.COMPLETED

    def tick_until_settled(self) -> None:
        """Resolve, then install on the nodes: a tick each, waiting for the builds between."""
        for _ in range(3):
            self.harness.tick()
            self.settle()


@pytest.fixture
def rig(tmp_path: Path, wheels: Path) -> Iterator[Rig]:
    made = Rig(tmp_path, wheels)
    yield made
    made.service.close()
    made.harness.close()


def test_each_node_of_the_placement_installs_the_environment_before_the_trial_starts(
    rig: Rig,
) -> None:
    trial_id = rig.submit("spread", workers=2, cpus=8)  # one rank on each node
    rig.harness.tick()
    assert "building its environment" in (rig.harness.trial(trial_id).pending_reason or "")
    rig.settle()  # resolved on the control plane ...
    rig.harness.tick()
    trial = rig.harness.trial(trial_id)
    assert trial.state == TrialState.QUEUED  # ... and now installing on both nodes
    assert (trial.pending_reason or "").startswith("building its environment")
    assert "on 2 nodes" in (trial.pending_reason or "")
    assert rig.harness.attempts(trial_id) == []  # no slot held while uv runs
    rig.settle()
    rig.harness.tick()
    assert rig.harness.trial(trial_id).state == TrialState.SCHEDULED
    (attempt,) = rig.harness.executor.attempts.values()
    (record,) = rig.store.list(None)
    assert record.key is not None
    # the rank finds it by key in its own node's cache; no path of the control plane's
    assert attempt.launch.environment_dir is None
    assert attempt.launch.environment_key == record.key
    for node in ("node-0", "node-1"):
        assert rig.nodes.builder(node).path(record.key) is not None
    assert not (rig.harness.store.root.parent / "control-plane-envs").exists()
    assert sorted(rig.nodes.calls) == ["node-0", "node-1"]  # once per node
    assert record.num_builds == 2
    assert record.size_bytes > 0

    # another trial on a node that has it: started in the same tick, nothing installed
    rig.complete(trial_id, 2)
    second = rig.submit("packed", workers=1, cpus=8)
    rig.harness.tick()
    assert rig.harness.trial(second).state == TrialState.SCHEDULED
    assert sorted(rig.nodes.calls) == ["node-0", "node-1"]


def test_a_node_lost_while_installing_is_tried_again_not_failed(rig: Rig) -> None:
    rig.nodes.lose = {"node-0", "node-1"}
    trial_id = rig.submit("lost", workers=1, cpus=8)
    rig.tick_until_settled()
    assert rig.harness.trial(trial_id).state == TrialState.QUEUED  # the install went away
    rig.tick_until_settled()
    assert rig.harness.trial(trial_id).state == TrialState.SCHEDULED
    assert len(rig.nodes.calls) == 2  # lost once, installed the second time


def test_a_node_whose_base_differs_fails_the_trial_once_saying_which(rig: Rig) -> None:
    rig.nodes.other_base = {"node-0", "node-1"}
    trial_id = rig.submit("mismatch", workers=1, cpus=8)
    rig.tick_until_settled()
    trial = rig.harness.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert trial.num_attempts == 0
    message = trial.message or ""
    assert message.startswith("its environment could not be built: on node node-")
    assert "is not the control plane's" in message


def test_removing_an_environment_removes_it_from_the_nodes(rig: Rig) -> None:
    trial_id = rig.submit("rm", workers=1, cpus=8)
    rig.tick_until_settled()
    rig.complete(trial_id, 1)
    (record,) = rig.store.list(None)
    assert record.key is not None
    removed = rig.service.remove(rig.harness.principal, record.key[:12])
    assert [r.key for r in removed] == [record.key]
    assert rig.nodes.removed == [record.key]
    assert all(rig.nodes.builder(n).path(record.key) is None for n in ("node-0", "node-1"))
