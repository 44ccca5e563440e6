"""The warm pool's registry (warm_pool.py): a warm rank's processes are found by their session,
and an entry whose pid was reused by a later process is ignored."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainhub.adapters.ray_executor import warm_pool


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "warm-ranks"
    monkeypatch.setattr(warm_pool, "registry_dir", lambda: folder)
    return folder


def _session_leader_with_a_child() -> subprocess.Popen[bytes]:
    """A process in a session of its own (as a warm rank is) that forked a child."""
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _children(pid: int, timeout_s: float = 10.0) -> list[int]:
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [c.pid for c in psutil.Process(pid).children()]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the child never forked")


def test_a_registered_rank_and_what_it_forked_are_found_by_session(registry: Path) -> None:
    leader = _session_leader_with_a_child()
    try:
        child = _children(leader.pid)[0]
        warm_pool.register_rank(leader.pid, {"TRAINHUB_TRIAL_ID": "7", "RANK": "1", "X": "no"})

        ranks = warm_pool.registered_ranks()
        assert ranks == {leader.pid: {"TRAINHUB_TRIAL_ID": "7", "RANK": "1"}}  # only those
        for pid in (leader.pid, child):
            assert warm_pool.warm_rank_environment(pid, ranks) == ranks[leader.pid]
        assert warm_pool.warm_rank_environment(os.getpid(), ranks) is None  # not its session

        warm_pool.unregister_rank(leader.pid)
        assert warm_pool.registered_ranks() == {}
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_an_entry_whose_pid_was_reused_is_ignored(registry: Path) -> None:
    leader = _session_leader_with_a_child()
    try:
        warm_pool.register_rank(leader.pid, {"TRAINHUB_TRIAL_ID": "7"})
        entry = registry / str(leader.pid)
        written = time.time() - 3600  # written before this process started: not about it
        os.utime(entry, (written, written))

        assert warm_pool.registered_ranks() == {}
        assert warm_pool.warm_rank_environment(leader.pid) is None
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
    warm_pool.register_rank(leader.pid, {"TRAINHUB_TRIAL_ID": "7"})  # a pid that is gone
    assert warm_pool.registered_ranks() == {}
