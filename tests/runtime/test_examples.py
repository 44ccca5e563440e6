"""The examples run the ways their docstrings say: torchrun, plain python, as a trial.

The MNIST example's two long runs have files of their own (test_mnist_example.py under torchrun
then standalone, test_mnist_trial.py as a two-rank trial): ``--dist loadfile`` runs a file on
one worker, and the three trainings in one file were one worker's long tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.examples import MNIST, PLAIN, TORCHRUN, json_lines, run
from trainhub.core.spec import check_entrypoint_exists, parse_spec


@pytest.mark.parametrize("example", [MNIST, PLAIN])
def test_experiment_spec_is_valid(example: Path) -> None:
    spec = parse_spec((example / "experiment.yaml").read_text())
    check_entrypoint_exists(spec, {p.name for p in example.iterdir()})
    assert spec.resources.workers == 2
    assert spec.resources.gpus_per_worker == 0


@pytest.mark.slow
def test_plain_torchrun_script_runs_with_two_ranks(tmp_path: Path) -> None:
    out = run(
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
    assert [line["step"] for line in json_lines(out)] == [0, 1, 2]
