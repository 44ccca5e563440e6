"""The runtime in real rank processes, launched the way the executor launches them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.runtime.fake_control_plane import FakeControlPlane, free_port

SCRIPTS = Path(__file__).parent / "scripts"


def _rank_env(plane: FakeControlPlane, rank: int, world_size: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        **plane.env(TRAINHUB_SIGNALS_POLL_S="0.1", TRAINHUB_METRICS_BATCH_S="0.1"),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def test_every_rank_stops_at_the_same_step(plane: FakeControlPlane, tmp_path: Path) -> None:
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "stop_agreement.py")],
            env={**_rank_env(plane, rank, 2, port), "TRAINHUB_SPOOL_DIR": str(tmp_path)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while not any(p["step"] >= 20 for p in plane.points()):
            assert time.monotonic() < deadline, "the ranks did not start training"
            assert all(rank.poll() is None for rank in ranks), "a rank exited early"
            time.sleep(0.05)
        with plane.lock:
            plane.signals = {"should_stop": True, "reason": "pruned"}
        outputs = [json.loads(rank.communicate(timeout=60)[0]) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()

    assert [rank.returncode for rank in ranks] == [0, 0]
    assert outputs[0]["step"] == outputs[1]["step"] < 5000
    assert [out["reason"] for out in outputs] == ["pruned", "pruned"]
    # each rank trained on its own half of the data
    assert sorted(outputs[0]["shard"] + outputs[1]["shard"]) == list(range(10))
    # rank 0 alone reported
    assert len(plane.values_by_step()) == outputs[0]["step"]


def test_sigterm_flushes_pending_points_before_exit(
    plane: FakeControlPlane, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        **plane.env(TRAINHUB_METRICS_BATCH_S="60", TRAINHUB_SPOOL_DIR=str(tmp_path)),
    }
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "report_then_wait.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        assert plane.points() == []  # still waiting for its batch
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()

    assert process.returncode == 128 + signal.SIGTERM, err
    assert sorted(plane.values_by_step()) == [0, 1, 2, 3, 4]
