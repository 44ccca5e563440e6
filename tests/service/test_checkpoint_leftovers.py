"""The sweep of checkpoints never published (ADR 0047), one control-loop tick at a time: real
SQLite, the real checkpoint-set use cases, a folder store and a SeaweedFS bucket."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.seaweedfs import SeaweedS3
from tests.service.loop_harness import LoopHarness, SteppedClock, cpu_nodes
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.states import TrialState
from trainhub.service.artifact_sets import SetMember, read_set
from trainhub.service.checkpoint_sets import CheckpointSets, MemberTarget, RankReport
from trainhub.service.control_loop import LoopConfig
from trainhub.service.direct_checkpoints import DirectCheckpoints
from trainhub.service.keys import checkpoint_set_key
from trainhub.service.ports import ArtifactStore
from trainhub.service.records import Checkpoint
from trainhub.service.tracking import TrackingService

SPEC = "name: sharded\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 2}\n"
INTERVAL_S, GRACE_S = 60.0, 300.0
CONFIG = LoopConfig(
    "http://127.0.0.1:1", leftover_sweep_interval_s=INTERVAL_S, leftover_grace_s=GRACE_S
)


class Ranks:
    """What a trial's ranks do to store a sharded checkpoint, through the real use cases."""

    def __init__(self, h: LoopHarness, route: str = "control-plane") -> None:
        self.h = h
        self.tracking = TrackingService(h.uow, h.store, h.clock)
        self.sets = CheckpointSets(DirectCheckpoints(self.tracking, h.store, route))

    def target(self, trial_id: int, uuid: str, name: str, size: int) -> MemberTarget:
        target = self.sets.target(self.h.principal, trial_id, uuid, name, 1, 1, size)
        assert not isinstance(target, Checkpoint)
        return target

    def member(self, trial_id: int, uuid: str, name: str, data: bytes) -> SetMember:
        writer = self.sets.open_member_writer(self.target(trial_id, uuid, name, len(data)))
        writer.write(data)
        writer.commit()
        return SetMember(name, len(data), hashlib.sha256(data).hexdigest())

    def report(self, trial_id: int, uuid: str, rank: int, *members: SetMember) -> None:
        report = RankReport(rank, 2, 1, 1, {}, members)
        self.sets.report(self.h.principal, trial_id, uuid, report)


def start(h: LoopHarness, *trial_ids: int) -> None:
    assert h.tick().started == list(trial_ids)
    for trial_id in trial_ids:
        h.executor.run(h.key(trial_id))
    h.tick()
    assert all(h.trial(t).state == TrialState.RUNNING for t in trial_ids)


def keys(store: ArtifactStore, prefix: str) -> list[str]:
    return [b.key for b in store.list(prefix)]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[LoopHarness]:
    harness = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(2), CONFIG)
    yield harness
    harness.close()


def test_an_ended_attempt_s_unpublished_set_goes_a_running_one_s_and_published_stay(
    h: LoopHarness,
) -> None:
    ended, running = h.submit(SPEC), h.submit(SPEC)
    start(h, ended, running)
    ranks = Ranks(h)
    # published: both ranks stored their files and reported
    ranks.report(ended, "pub", 0, ranks.member(ended, "pub", "__0_0.distcp", b"a" * 300))
    ranks.report(ended, "pub", 1, ranks.member(ended, "pub", "__1_0.distcp", b"b" * 300))
    # never published: rank 1 stored its file and was killed before its report
    ranks.report(ended, "lost", 0, ranks.member(ended, "lost", "__0_0.distcp", b"c" * 500))
    ranks.member(ended, "lost", "__1_0.distcp", b"d" * 500)
    # a one-file checkpoint the control plane was streaming when it was killed
    upload = ranks.tracking.begin_checkpoint(h.principal, ended, "cut", 1, 1, {}, None)
    assert not isinstance(upload, Checkpoint)
    ranks.tracking.open_checkpoint_writer(upload).write(b"e" * 700)
    (partial,) = h.store.list_unfinished(f"tenants/default/checkpoints/trial-{ended}/")
    os.utime(h.store.local_path(partial.key), (h.clock(), h.clock()))  # type: ignore[attr-defined]
    # the running trial's rank 0 stored its file; rank 1 is still writing
    ranks.member(running, "now", "__0_0.distcp", b"f" * 500)
    lost = checkpoint_set_key("default", ended, "lost")
    published = checkpoint_set_key("default", ended, "pub")
    in_flight = checkpoint_set_key("default", running, "now")
    with h.uow() as repo:
        counted = repo.checkpoint_bytes_by_tenant()
    assert counted == {"default": 600}  # the quotas never saw the unpublished bytes
    assert len(keys(h.store, f"{lost}/")) == 3  # two members and rank 0's report

    h.executor.exit(h.key(ended), [0, 0])
    h.clock.step(INTERVAL_S)
    assert h.tick().leftovers is not None  # swept, but within the grace: all kept
    assert h.trial(ended).state == TrialState.COMPLETED
    assert len(keys(h.store, f"{lost}/")) == 3
    h.clock.step(GRACE_S)
    report = h.tick().leftovers
    assert report is not None
    assert {s.storage_key for s in report.swept} == {lost, None}
    assert report.bytes_freed == 1000 + len(
        RankReport(0, 2, 1, 1, {}, (SetMember("__0_0.distcp", 500, "0" * 64),)).to_json()
    )
    assert keys(h.store, f"{lost}/") == []
    assert h.store.list_unfinished("tenants/") == []
    assert keys(h.store, f"{in_flight}/") == [f"{in_flight}/__0_0.distcp"]
    found = read_set(h.store, published)
    assert found is not None
    assert sorted(m.name for m in found.members) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert any("never published" in e for e in h.events(ended))
    with h.uow() as repo:
        assert repo.checkpoint_bytes_by_tenant() == counted
    # the next interval finds nothing more to do, and the running trial's file stays
    h.clock.step(INTERVAL_S + GRACE_S)
    report = h.tick().leftovers
    assert report is not None
    assert report.swept == []
    assert keys(h.store, f"{in_flight}/") == [f"{in_flight}/__0_0.distcp"]


def test_a_lost_attempt_s_leftover_stays_while_the_next_attempt_runs(h: LoopHarness) -> None:
    trial = h.submit(SPEC)
    start(h, trial)
    ranks = Ranks(h)
    ranks.member(trial, "first", "__0_0.distcp", b"x" * 100)
    first = checkpoint_set_key("default", trial, "first")
    h.executor.lose(h.key(trial), "node lost")  # ends the attempt; the trial restarts at once
    h.clock.step(INTERVAL_S)
    h.tick()
    assert h.attempts(trial)[0].outcome is not None
    assert h.trial(trial).state == TrialState.SCHEDULED
    h.executor.run(h.key(trial))
    ranks.member(trial, "second", "__0_0.distcp", b"y" * 100)
    h.clock.step(GRACE_S)
    report = h.tick().leftovers
    # nothing in an object says which attempt wrote it: while one is open, all stay
    assert report is not None
    assert report.swept == []
    assert keys(h.store, f"{first}/") == [f"{first}/__0_0.distcp"]
    h.executor.exit(h.key(trial), [0, 0])
    h.clock.step(INTERVAL_S)
    h.tick()
    h.clock.step(GRACE_S)
    report = h.tick().leftovers
    assert report is not None
    assert sorted(str(s.storage_key) for s in report.swept) == [
        first,
        checkpoint_set_key("default", trial, "second"),
    ]


def test_on_seaweedfs_an_ended_attempt_s_set_and_uploads_go_a_running_one_s_stay(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    # the bucket dates its uploads: the stepped clock starts at the real time
    store = seaweed.store(part_bytes=5 << 20, concurrency=2)
    h = LoopHarness(
        tmp_path, FifoPolicy(), cpu_nodes(2), CONFIG, store=store, clock=SteppedClock(time.time())
    )
    try:
        ended, running = h.submit(SPEC), h.submit(SPEC)
        start(h, ended, running)
        ranks = Ranks(h, route="direct")
        ranks.report(ended, "lost", 0, ranks.member(ended, "lost", "__0_0.distcp", b"c" * 500))
        # rank 1 sends its parts itself (presigned URLs) and is killed before completing
        target = ranks.target(ended, "lost", "__1_0.distcp", 6 << 20)
        assert ranks.sets.begin_direct_member(target, 6 << 20) is not None
        # the running trial: one file stored, another's upload open
        ranks.member(running, "now", "__0_0.distcp", b"f" * 500)
        busy = ranks.target(running, "now", "__1_0.distcp", 6 << 20)
        assert ranks.sets.begin_direct_member(busy, 6 << 20) is not None
        lost = checkpoint_set_key("default", ended, "lost")
        in_flight = checkpoint_set_key("default", running, "now")
        assert len(store.list_unfinished("tenants/")) == 2

        h.executor.exit(h.key(ended), [0, 0])
        h.clock.step(INTERVAL_S)
        h.tick()
        h.clock.step(GRACE_S)
        report = h.tick().leftovers
        assert report is not None
        assert [s.storage_key for s in report.swept] == [lost]
        assert keys(store, f"{lost}/") == []
        assert [u.key for u in store.list_unfinished("tenants/")] == [busy.key]
        assert keys(store, f"{in_flight}/") == [f"{in_flight}/__0_0.distcp"]
    finally:
        h.close()
