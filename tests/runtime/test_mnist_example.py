"""The MNIST example under torchrun reaches its accuracy, then resumes standalone from its
last checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.runtime.examples import MNIST, TORCHRUN, json_lines, run
from trainhub.core.spec import parse_spec


@pytest.mark.slow
def test_mnist_reaches_95_percent_under_torchrun_and_resumes_standalone(tmp_path: Path) -> None:
    run([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(MNIST / "train.py")], tmp_path)

    lines = json_lines((tmp_path / "trainhub-metrics.jsonl").read_text())
    epochs = parse_spec((MNIST / "experiment.yaml").read_text()).hyperparameters["epochs"]
    assert [line["step"] for line in lines] == list(range(epochs))  # rank 0 alone reported
    assert lines[-1]["val_accuracy"] >= 0.95
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(
        f"step-{epoch}.pt" for epoch in range(epochs)
    )

    # a second run in the same directory picks up the last checkpoint: nothing left to train
    out = run([sys.executable, str(MNIST / "train.py")], tmp_path)
    assert f"resuming after epoch {epochs - 1}" in out
    assert len(json_lines((tmp_path / "trainhub-metrics.jsonl").read_text())) == epochs
