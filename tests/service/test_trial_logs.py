"""Capped rank logs on a real local artifact store: head, marker, tail; a restart finds its
place again from the stored log alone."""

from __future__ import annotations

from pathlib import Path

from trainhub.adapters.storage import LocalArtifactStore
from trainhub.core.log_cap import LogCap, find_marker
from trainhub.service.trial_logs import RankLogs

KEY = "tenants/t/trials/1/logs/attempt-1/rank-0.log"


def _lines(start: int, stop: int) -> bytes:
    return b"".join(f"line {i:07d}\n".encode() for i in range(start, stop))


def test_a_flood_keeps_the_head_the_marker_and_the_last_lines(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    logs = RankLogs(store)
    cap = LogCap(64 * 1024)
    position = logs.position(KEY, cap)
    output = _lines(0, 40_000)  # 520 KB, eight caps
    for offset in range(0, len(output), 7_000):  # chunks as polls bring them
        logs.append(KEY, position, cap, output[offset : offset + 7_000])
    stored = store.get(KEY)
    assert len(stored) <= cap.cap_bytes
    assert stored.startswith(b"line 0000000\n")
    assert stored.endswith(b"line 0039999\n")
    found = find_marker(stored[: cap.head_bytes + 300])
    assert found is not None
    start, end, dropped = found
    assert len(stored) - (end - start) + dropped == len(output)  # every byte accounted
    assert position.read == len(output)
    # a restarted control plane reads its place from the stored log
    again = logs.position(KEY, cap)
    assert (again.stored, again.read, again.dropped) == (len(stored), len(output), dropped)
    logs.append(KEY, again, cap, b"after restart\n")
    assert store.get(KEY).endswith(b"line 0039999\nafter restart\n")


def test_a_reader_far_behind_skips_to_the_latest_output(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    logs = RankLogs(store)
    cap = LogCap(64 * 1024)
    position = logs.position(KEY, cap)
    output = _lines(0, 100_000)  # 1.3 MB on the node, read 8 KB at a time
    logs.append(KEY, position, cap, output[:8192])
    logs.skip_behind(position, cap, log_size=len(output))
    assert position.read == len(output) - cap.tail_bytes
    logs.append(KEY, position, cap, output[position.read :])
    stored = store.get(KEY)
    assert stored.endswith(b"line 0099999\n")
    found = find_marker(stored[: cap.head_bytes + 300])
    assert found is not None
    start, end, dropped = found
    assert len(stored) - (end - start) + dropped == len(output)


def test_a_short_log_is_stored_as_it_came(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    logs = RankLogs(store)
    cap = LogCap(64 * 1024)
    position = logs.position(KEY, cap)
    logs.append(KEY, position, cap, b"hello\n")
    logs.append(KEY, position, cap, b"world\n")
    assert store.get(KEY) == b"hello\nworld\n"
    assert (position.stored, position.read) == (12, 12)


def test_a_first_chunk_past_the_cap_keeps_its_head(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    logs = RankLogs(store)
    cap = LogCap(64 * 1024)
    position = logs.position(KEY, cap)
    output = _lines(0, 20_000)  # 260 KB in the first poll, before anything was stored
    logs.append(KEY, position, cap, output[: 128 * 1024])
    logs.skip_behind(position, cap, log_size=len(output))
    logs.append(KEY, position, cap, output[position.read :])
    stored = store.get(KEY)
    assert stored.startswith(b"line 0000000\n")
    assert stored.endswith(b"line 0019999\n")
    found = find_marker(stored[: cap.head_bytes + 300])
    assert found is not None
    start, end, dropped = found
    assert start == cap.head_bytes
    assert len(stored) - (end - start) + dropped == len(output)
