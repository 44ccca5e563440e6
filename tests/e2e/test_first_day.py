"""End to end, through a real control plane, Ray and training processes: what a new user's
first day runs into (issue 31) - a prune stops the trial at the report it was decided on, a
misspelt searcher metric is a warning and fails the trial, an import error is not retried
again and again."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "first_day_workload"
# 0.2-second epochs; the signal heartbeat stays at its default (5 s), so only the reply to a
# report can stop a trial within an epoch or two
PRUNE = """
name: fast-prune
entrypoint: python epochs.py
resources: {cpus_per_worker: 1}
hyperparameters:
  q: {type: float, low: 0.0, high: 1.0}
  steps: 9
  sleep_s: 0.2
searcher: {sampler: random, pruner: asha, metric: val_accuracy, max_trials: 6,
           max_concurrent_trials: 2, budget: {min: 1, max: 9}, reduction_factor: 3, seed: 4}
max_restarts: 0
"""
TYPO = """
name: typo
entrypoint: python epochs.py
resources: {cpus_per_worker: 1}
hyperparameters: {q: {type: float, low: 0.4, high: 0.6}, steps: 30, sleep_s: 0.2}
searcher: {sampler: random, metric: val_acc, max_trials: 1}
max_restarts: 0
"""
IMPORT = """
name: broken-import
entrypoint: python broken_import.py
resources: {cpus_per_worker: 1}
max_restarts: 3
"""


def _experiment(plane: ControlPlaneProcess, experiment_id: int) -> dict[str, Any]:
    return dict(plane.request("GET", f"/experiments/{experiment_id}").json())


def _wait_ended(plane: ControlPlaneProcess, experiment_id: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while (experiment := _experiment(plane, experiment_id))["state"] == "ACTIVE":
        assert time.monotonic() < deadline, plane.log_tail(80)
        time.sleep(0.5)
    return experiment


def test_a_pruned_trial_stops_at_most_one_report_past_its_pruning_step(
    control_plane: ControlPlaneProcess,
) -> None:
    experiment_id = control_plane.submit(PRUNE, WORKLOAD)["id"]
    experiment = _wait_ended(control_plane, experiment_id, 300)
    pruned = [t for t in experiment["trials"] if t["state"] == "PRUNED"]
    assert pruned, [(t["state"], t["message"]) for t in experiment["trials"]]
    for trial in pruned:
        detail = control_plane.trial(trial["id"])
        reason = next(e["message"] for e in detail["events"] if e["kind"] == "prune")
        match = re.search(r"at step (\d+)", reason)
        assert match, reason
        pruned_at = int(match.group(1))
        last = max(p["step"] for p in control_plane.metrics(trial["id"]))
        assert last <= pruned_at + 1, (trial["id"], reason, last)
        log = control_plane.log(trial["id"], 0)
        assert re.search(r"STOPPED at step \d+: pruned by the asha pruner", log), log[-2000:]


def test_a_misspelt_searcher_metric_is_a_warning_and_fails_the_trial(
    control_plane: ControlPlaneProcess,
) -> None:
    experiment_id = control_plane.submit(TYPO, WORKLOAD)["id"]
    experiment = _wait_ended(control_plane, experiment_id, 180)
    (trial,) = experiment["trials"]
    assert trial["state"] == "FAILED", trial
    assert "searcher metric 'val_acc' is not reported" in trial["message"]
    assert "did you mean 'val_accuracy'?" in trial["message"]
    assert any("did you mean 'val_accuracy'?" in w for w in trial["warnings"])
    assert any(
        "no trial has reported searcher metric 'val_acc'" in w for w in experiment["warnings"]
    )
    detail = control_plane.trial(trial["id"])
    assert any("did you mean 'val_accuracy'?" in w for w in detail["warnings"])
    # it stopped soon after the warning was certain, not after 30 epochs
    assert max(p["step"] for p in control_plane.metrics(trial["id"])) < 30
    progress = control_plane.request("GET", f"/experiments/{experiment_id}/search").json()
    assert any("val_accuracy" in w for w in progress["warnings"])


def test_an_import_error_is_not_retried_after_it_repeats(
    control_plane: ControlPlaneProcess,
) -> None:
    experiment_id = control_plane.submit(IMPORT, WORKLOAD)["id"]
    experiment = _wait_ended(control_plane, experiment_id, 180)
    (trial,) = experiment["trials"]
    assert trial["state"] == "FAILED", trial
    assert trial["num_attempts"] == 2, trial
    assert "failed the same way twice before training started" in trial["message"]
    assert "module 'sklearnx' is not installed" in trial["message"]
    assert "docs/environments.md" in trial["message"]
