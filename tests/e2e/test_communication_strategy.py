"""End to end: one line of the spec (``distributed.strategy``) picks the gradient
communication of the MNIST example's trial, and its step timer reports where the time goes."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.examples import MNIST, mnist_spec
from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def test_a_spec_line_selects_the_communication_strategy(
    control_plane: ControlPlaneProcess,
) -> None:
    spec = yaml.safe_load(mnist_spec())
    spec["distributed"] = {"strategy": "powersgd", "powersgd": {"rank": 2, "start_step": 5}}
    experiment = control_plane.submit(yaml.safe_dump(spec), MNIST)
    trial_id = experiment["trials"][0]["id"]
    trial = control_plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", what="COMPLETED")
    metrics = trial["latest_metrics"]
    assert metrics["val_accuracy"] >= 0.9
    # where the time goes, reported by the example's step timer
    for name in ("time/sync_share", "time/forward_share", "comm/bytes_per_step"):
        assert name in metrics
    # PowerSGD of rank 2 sends far fewer bytes than LeNet-5's 61k fp32 gradients (~245 kB)
    assert 0 < metrics["comm/bytes_per_step"] < 150_000
