"""The repository's examples as e2e trials: their folders and a spec with changed
hyperparameters (shared by the e2e files that train them)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.fixtures.control_plane import REPO

MNIST = REPO / "examples" / "mnist"
TORCHRUN = REPO / "examples" / "torchrun_plain"


def mnist_spec(**hparams: Any) -> str:
    spec = yaml.safe_load((MNIST / "experiment.yaml").read_text())
    spec["hyperparameters"].update(hparams)
    return yaml.safe_dump(spec)


def steps_of(metrics: list[dict[str, Any]], name: str) -> list[int]:
    return [p["step"] for p in metrics if name in p["values"]]
