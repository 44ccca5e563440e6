"""End to end: an ASHA search through a real control plane and Ray, killed and restarted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "search_workload"
SPEC = """
name: e2e-asha
entrypoint: python train.py
resources: {cpus_per_worker: 1}
hyperparameters:
  q: {type: float, low: 0.0, high: 1.0}
  steps: 9
searcher: {sampler: random, pruner: asha, metric: acc, max_trials: 6, max_concurrent_trials: 2,
           budget: {min: 1, max: 9}, reduction_factor: 3, seed: 4}
environment: {variables: {TRAINHUB_SIGNALS_POLL_S: "0.3"}}
max_restarts: 1
"""


def test_asha_search_prunes_and_survives_a_control_plane_kill(
    control_plane: ControlPlaneProcess,
) -> None:
    experiment_id = control_plane.submit(SPEC, WORKLOAD)["id"]

    def experiment() -> dict:
        return dict(control_plane.request("GET", f"/experiments/{experiment_id}").json())

    deadline = time.monotonic() + 120
    while not any(t["state"] == "RUNNING" for t in experiment()["trials"]):
        assert time.monotonic() < deadline, control_plane.log_tail()
        time.sleep(0.5)
    control_plane.kill()
    control_plane.start()
    deadline = time.monotonic() + 300
    while experiment()["state"] == "ACTIVE":
        assert time.monotonic() < deadline, control_plane.log_tail()
        time.sleep(1.0)
    trials = experiment()["trials"]
    states = sorted(t["state"] for t in trials)
    assert len(trials) == 6, (states, control_plane.log_tail(80))
    assert "PRUNED" in states
    assert "COMPLETED" in states
    assert set(states) <= {"PRUNED", "COMPLETED"}
    progress = control_plane.request("GET", f"/experiments/{experiment_id}/search").json()
    assert progress["search_state"] == "FINISHED"
    pruned = [r for r in progress["data"] if r["state"] == "PRUNED"]
    assert all(r["stop_detail"].startswith("pruned by the asha pruner") for r in pruned)
    # the runtime of a pruned trial saw should_stop() (or was ended by the SIGTERM path)
    logs = [control_plane.log(r["id"], 0) for r in pruned]
    assert any("STOPPED at step" in text for text in logs), logs
