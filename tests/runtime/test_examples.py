"""The examples run the ways their docstrings say: torchrun, plain python, as a trial."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.fake_control_plane import FakeControlPlane, free_port
from trainhub.core.spec import check_entrypoint_exists, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MNIST = EXAMPLES / "mnist"
PLAIN = EXAMPLES / "torchrun_plain"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _json_lines(text: str) -> list[dict[str, float]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("example", [MNIST, PLAIN])
def test_experiment_spec_is_valid(example: Path) -> None:
    spec = parse_spec((example / "experiment.yaml").read_text())
    check_entrypoint_exists(spec, {p.name for p in example.iterdir()})
    assert spec.resources.workers == 2
    assert spec.resources.gpus_per_worker == 0


@pytest.mark.slow
def test_mnist_reaches_95_percent_under_torchrun_and_resumes_standalone(tmp_path: Path) -> None:
    _run([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(MNIST / "train.py")], tmp_path)

    lines = _json_lines((tmp_path / "trainhub-metrics.jsonl").read_text())
    epochs = parse_spec((MNIST / "experiment.yaml").read_text()).hyperparameters["epochs"]
    assert [line["step"] for line in lines] == list(range(epochs))  # rank 0 alone reported
    assert lines[-1]["val_accuracy"] >= 0.95
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(
        f"step-{epoch}.pt" for epoch in range(epochs)
    )

    # a second run in the same directory picks up the last checkpoint: nothing left to train
    out = _run([sys.executable, str(MNIST / "train.py")], tmp_path)
    assert f"resuming after epoch {epochs - 1}" in out
    assert len(_json_lines((tmp_path / "trainhub-metrics.jsonl").read_text())) == epochs


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


@pytest.mark.slow
def test_plain_torchrun_script_runs_with_two_ranks(tmp_path: Path) -> None:
    out = _run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            str(PLAIN / "train.py"),
            "--epochs",
            "3",
        ],
        tmp_path,
    )
    assert "world_size=2" in out
    assert [line["step"] for line in _json_lines(out)] == [0, 1, 2]
