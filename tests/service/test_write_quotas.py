"""The control loop holds what trials write on their nodes against their storage quotas, and
caps their stored logs, one tick at a time (real SQLite and store, a fake executor)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.core.log_cap import find_marker
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.states import TrialState
from trainhub.service.admin import QuotaChange
from trainhub.service.control_loop import LoopConfig
from trainhub.service.keys import log_key

SPEC = "name: w\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 1}\n"
MiB = 1024**2


class Files:
    """The TrialFiles port, recording what it was asked."""

    def __init__(self) -> None:
        self.frozen: list[int] = []
        self.discarded: list[int] = []

    def freeze_trial_files(self, trial_id: int) -> None:
        self.frozen.append(trial_id)

    def discard_trial_files(self, trial_id: int) -> None:
        self.discarded.append(trial_id)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[LoopHarness]:
    config = LoopConfig("http://127.0.0.1:1", max_log_bytes_per_trial=256 * 1024)
    harness = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(2), config)
    harness.loop.trial_files = Files()
    for name, trial_quota in (("small", 50 * MiB), ("other", None)):
        harness.admin.create_tenant(
            harness.principal, name, quotas=QuotaChange(max_trial_storage_bytes=trial_quota)
        )
    yield harness
    harness.close()


def running(h: LoopHarness, tenant: str) -> tuple[int, str]:
    trial_id = h.submit(SPEC, tenant)
    h.tick()
    key = h.key(trial_id)
    h.executor.run(key)
    h.tick()
    assert h.trial(trial_id).state == TrialState.RUNNING
    return trial_id, key


def measure(h: LoopHarness, key: str, folders: dict[int, dict[str, int]]) -> None:
    attempt = h.executor.attempts[key]
    attempt.ranks = [replace(r, disk=tuple(folders[r.rank].items())) for r in attempt.ranks]


def test_a_trial_over_its_quota_is_stopped_with_the_numbers(h: LoopHarness) -> None:
    files = h.loop.trial_files
    assert isinstance(files, Files)
    hostile, key = running(h, "small")
    calm, calm_key = running(h, "other")
    shared = "/storage/trial-checkpoints/trial-1"  # both ranks see it: counted once
    measure(h, key, {0: {shared: 40 * MiB, "/work/r0": 5 * MiB}, 1: {shared: 40 * MiB}})
    measure(h, calm_key, {0: {"/work/c0": 60 * MiB}, 1: {}})
    h.tick()
    assert h.trial(hostile).disk_bytes == 45 * MiB
    assert h.trial(hostile).stop_reason is None  # 45 MiB < 50 MiB
    measure(h, key, {0: {shared: 60 * MiB, "/work/r0": 5 * MiB}, 1: {shared: 60 * MiB}})
    h.tick()
    trial = h.trial(hostile)
    assert trial.cancel_requested
    assert trial.stop_reason is not None
    assert "storage quota exceeded: trial" in trial.stop_reason
    assert "0.06 GiB in its checkpoint folder, home and scratch" in trial.stop_reason
    assert "its quota is 0.05 GiB" in trial.stop_reason
    assert any(e.startswith("quota: storage quota exceeded") for e in h.events(hostile))
    assert files.frozen == [hostile]
    assert h.trial(calm).stop_reason is None  # 60 MiB under the default quota
    for _ in range(4):  # asked to stop, then SIGTERM, then its end
        h.clock.step(11)
        h.tick()
    assert h.trial(hostile).state == TrialState.CANCELED
    assert files.discarded == [hostile]  # its folder removed, no longer counted
    assert h.trial(hostile).disk_bytes == 0
    assert h.trial(calm).state == TrialState.RUNNING


def test_a_loud_rank_keeps_its_head_its_tail_and_a_marker(h: LoopHarness) -> None:
    trial_id, key = running(h, "other")
    lines = b"".join(f"line {i:07d}\n".encode() for i in range(40_000))  # 520 KB
    h.executor.say(key, {0: lines})
    for _ in range(3):
        h.tick()
    h.executor.exit(key, [0, 0], {0: b"LAST LINE\n"})
    h.tick()
    assert h.trial(trial_id).state == TrialState.COMPLETED
    stored = h.store.get(log_key("other", trial_id, 1, 0))
    assert len(stored) <= 128 * 1024  # 256 KiB shared by 2 ranks
    assert stored.startswith(b"line 0000000\n")
    assert stored.endswith(b"line 0039999\nLAST LINE\n")
    found = find_marker(stored[: 64 * 1024])
    assert found is not None
    start, end, dropped = found
    assert len(stored) - (end - start) + dropped == len(lines) + len(b"LAST LINE\n")
