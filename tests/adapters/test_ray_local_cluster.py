"""ensure_local_ray / stop_local_ray: a head of its own, reused while it answers, replaced when
its record is stale, stopped without touching any other Ray instance of the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainhub.adapters.ray_executor import RayExecutor
from trainhub.adapters.ray_executor.local_cluster import (
    RECORD_NAME,
    HeadRecord,
    _head_processes,
    ensure_local_ray,
    head_answers,
    read_record,
    start_timed_out,
    stop_local_ray,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_start_reuse_replace_stale_and_stop(
    tmp_path: Path, ray_address: str, ray_executor: RayExecutor
) -> None:
    # a record left behind by a head that is long gone (e.g. before a reboot)
    stale = HeadRecord("127.0.0.1:1", str(tmp_path / "gone"), 0.0)
    (tmp_path / RECORD_NAME).write_text(json.dumps(stale.__dict__))
    assert not head_answers(stale)

    address = ensure_local_ray(tmp_path, num_cpus=1)
    try:
        record = read_record(tmp_path)
        assert record is not None
        assert record.address == address != ray_address  # its own head, not the session's
        assert head_answers(record)

        started = time.monotonic()
        assert ensure_local_ray(tmp_path, num_cpus=1) == address  # reused
        assert time.monotonic() - started < 10.0  # a start takes longer (and a new address)
    finally:
        stop_local_ray(tmp_path)

    assert read_record(tmp_path) is None
    assert _head_processes(record, with_descendants=True) == []
    assert not Path(record.temp_dir).exists()
    assert len(ray_executor.cluster_nodes()) == 1  # the session's head is untouched
    stop_local_ray(tmp_path)  # stopping twice is fine


def test_a_failed_start_finds_the_processes_that_name_only_its_gcs_port(tmp_path: Path) -> None:
    # Ray's client server names the head by --address=IP:PORT only: a start that failed before
    # its IP was known kills it by the port it picked (it leaked, importing Ray, before)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen([*argv, "--address=192.0.2.9:40123"])
    other = subprocess.Popen([*argv, "--address=192.0.2.9:140123"])
    try:
        record = HeadRecord(":40123", str(tmp_path / "ray"), 0.0)
        found = {p.pid for p in _head_processes(record, with_descendants=False)}
        assert ours.pid in found
        assert other.pid not in found
    finally:
        ours.kill()
        other.kill()
        ours.wait()
        other.wait()


def test_a_start_that_ran_out_of_time_is_told_from_one_that_cannot_work() -> None:
    # what `ray start` printed on a loaded machine (a node joining a GCS that answered late; a
    # head whose raylet did not register), against a refusal another try would repeat
    joined_late = (
        "INFO node.py:438 -- Failed to get node info b'RPC error: Deadline Exceeded'\n"
        "Traceback (most recent call last):"
    )
    assert start_timed_out(joined_late)
    assert start_timed_out("The node registration to the GCS timed out after 30 s")
    assert not start_timed_out("Error: Invalid value for '--num-cpus': 'two' is not a valid float")
