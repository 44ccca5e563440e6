"""The MNIST example as a two-rank trial (the launch variables an executor sets, a fake control
plane): it ships metrics and checkpoints and resumes from a checkpoint it is given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.examples import MNIST
from tests.runtime.fake_control_plane import FakeControlPlane, free_port


@pytest.mark.slow
def test_mnist_as_a_two_rank_trial_ships_metrics_and_resumes_from_a_checkpoint(
    plane: FakeControlPlane, tmp_path: Path
) -> None:
    context = tmp_path / "context"  # what the executor would unpack: the example directory
    shutil.copytree(MNIST, context)

    def attempt(number: int, restore: int | None) -> list[str]:
        port = free_port()
        ranks = []
        for rank in range(2):
            env = {
                **os.environ,
                **plane.env(),
                "TRAINHUB_ATTEMPT": str(number),
                "TRAINHUB_HPARAMS": json.dumps({"epochs": 3}),
                "TRAINHUB_SPOOL_DIR": str(tmp_path / f"attempt{number}-rank{rank}"),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            if restore is not None:
                env["TRAINHUB_RESTORE_CHECKPOINT"] = str(restore)
            ranks.append(
                subprocess.Popen(
                    [sys.executable, "train.py"],
                    cwd=context,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
        assert [rank.returncode for rank in ranks] == [0, 0], outputs
        return outputs

    attempt(1, restore=None)

    assert sorted(plane.values_by_step()) == [0, 1, 2]
    assert plane.values_by_step()[2]["val_accuracy"] > 0.5
    assert [c.step for c in plane.checkpoints.values()] == [0, 1, 2]
    assert plane.metric_batches[-1]["progress"] == {"current": 3.0, "total": 3.0, "unit": "epochs"}
    assert sorted(p.name for p in context.iterdir()) == sorted(p.name for p in MNIST.iterdir())

    after_epoch_1 = next(c.id for c in plane.checkpoints.values() if c.step == 1)
    rank0_output, _ = attempt(2, restore=after_epoch_1)

    assert "resuming after epoch 1 (attempt 2)" in rank0_output
    retried = [p["step"] for b in plane.metric_batches if b["attempt"] == 2 for p in b["points"]]
    assert retried == [2]
    assert [c.step for c in plane.checkpoints.values() if c.attempt == 2] == [2]
