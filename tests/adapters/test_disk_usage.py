"""The node side of write quotas: measuring a trial's folders on a real file system."""

from __future__ import annotations

import os
from pathlib import Path

from trainhub.adapters.ray_executor.disk_usage import DiskMeter, measure


def test_measure_counts_files_once_and_stops_at_its_bound(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "big").write_bytes(b"x" * 300_000)
    os.link(tmp_path / "a" / "big", tmp_path / "hard")  # a hard link is not twice the bytes
    (tmp_path / "link").symlink_to("/usr")  # not followed
    total, complete = measure(str(tmp_path), max_entries=100)
    assert complete
    assert 300_000 <= total < 320_000
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"y")
    partial, complete = measure(str(tmp_path), max_entries=10)
    assert not complete
    assert partial <= total + 50 * 4096


def test_a_sparse_file_counts_its_size(tmp_path: Path) -> None:
    with (tmp_path / "sparse").open("wb") as f:
        f.seek(50 * 1024**2)
        f.write(b"z")
    total, _ = measure(str(tmp_path), max_entries=10)
    assert total >= 50 * 1024**2


def test_the_meter_measures_on_its_thread(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10_000)
    meter = DiskMeter([str(tmp_path), str(tmp_path / "missing")], 3600, 1000)
    try:
        now = meter.measure_now()
        assert set(now) == {str(tmp_path)}
        assert meter.latest()[str(tmp_path)] >= 10_000
    finally:
        meter.stop()


def test_a_wake_measures_again_on_the_meters_thread(tmp_path: Path) -> None:
    import time

    meter = DiskMeter([str(tmp_path)], 3600, 1000)
    try:
        deadline = time.monotonic() + 10
        while str(tmp_path) not in meter.latest() and time.monotonic() < deadline:
            time.sleep(0.05)
        before = meter.latest()[str(tmp_path)]
        (tmp_path / "new").write_bytes(b"x" * 1_000_000)
        meter.wake()
        while meter.latest()[str(tmp_path)] == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert meter.latest()[str(tmp_path)] >= before + 1_000_000
    finally:
        meter.stop()
