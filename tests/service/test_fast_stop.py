"""A prune decided on a report rides on that report's reply, and a trial that does not report
the searcher's metric fails when the spec requires it (the search rig: real SQLite and Optuna,
fake processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.search_rig import Rig, build_rig
from trainhub.core.states import ExperimentState, TrialState

ASHA = """
name: asha
entrypoint: python -m train
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
searcher: {sampler: random, pruner: asha, metric: acc, max_trials: 6, max_concurrent_trials: 3,
           budget: {min: 1, max: 9}, reduction_factor: 3, seed: 1}
max_restarts: 0
"""


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    built = build_rig(f"sqlite:///{tmp_path / 'trainhub.db'}", tmp_path)
    built.tracking.observe_search = built.search.observe_trial  # as the server wires it
    return built


def running_trials(rig: Rig, experiment_id: int) -> list[int]:
    for _ in range(5):
        rig.tick()
    trials = rig.experiments.get(rig.admin, experiment_id).trials
    assert all(t.state == TrialState.RUNNING for t in trials), [t.state for t in trials]
    return [t.id for t in trials]


def test_a_prune_decided_on_a_report_rides_on_its_reply(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, ASHA, None, None).experiment.id
    first, second, third = running_trials(rig, experiment_id)
    for trial_id, acc in ((first, 0.9), (second, 0.8)):
        rig.tracking.report_metrics(rig.admin, trial_id, 1, [(1, {"acc": acc})])
    assert rig.tracking.signals(rig.admin, third) == (False, None)
    # no tick in between: the reply to the report itself carries the decision
    stop, reason = rig.tracking.report_metrics(rig.admin, third, 1, [(1, {"acc": 0.1})])
    assert stop
    assert reason is not None
    assert reason.startswith("pruned by the asha pruner: acc=0.1 at step 1")
    # a batch without the searcher's metric asks the searcher nothing, and still says stop
    assert rig.tracking.report_metrics(rig.admin, third, 1, [(1, {"loss": 2.0})])[0]
    # the best trial trains on
    assert rig.tracking.report_metrics(rig.admin, first, 1, [(2, {"acc": 0.95})]) == (False, None)
    # the tick that follows finds nothing new to report to Optuna and prunes nothing twice
    rig.tick()
    trials = {t.id: t for t in rig.experiments.get(rig.admin, experiment_id).trials}
    assert trials[first].cancel_requested is False
    assert trials[third].cancel_requested is True


def test_a_typo_of_the_metric_fails_the_trial_that_requires_it(rig: Rig) -> None:
    spec = ASHA.replace("metric: acc", "metric: val_acc")
    experiment_id = rig.experiments.submit(rig.admin, spec, None, None).experiment.id
    trial_id = running_trials(rig, experiment_id)[0]
    rig.tracking.report_metrics(rig.admin, trial_id, 1, [(0, {"val_accuracy": 0.5})])
    rig.tick()
    assert rig.tracking.signals(rig.admin, trial_id) == (False, None)  # step 0: too early
    rig.tracking.report_metrics(rig.admin, trial_id, 1, [(1, {"val_accuracy": 0.6})])
    rig.tick()
    stop, reason = rig.tracking.signals(rig.admin, trial_id)
    assert stop
    assert reason is not None
    assert "searcher metric 'val_acc' is not reported" in reason
    assert "did you mean 'val_accuracy'?" in reason
    rig.executor.exit(trial_id, 0)  # the script saw should_stop() and exited
    rig.tick()
    trial = rig.experiments.get_trial(rig.admin, trial_id).trial
    assert trial.state == TrialState.FAILED
    assert trial.message == reason
    # the same script fails every trial: the search makes no more, and ends with its last
    for other in rig.executor.running():
        rig.executor.exit(other, 0)
    for _ in range(3):
        rig.tick()
    detail = rig.experiments.get(rig.admin, experiment_id)
    assert len(detail.trials) == 3  # of max_trials: 6
    assert all(t.state.is_terminal for t in detail.trials)
    assert detail.experiment.state != ExperimentState.ACTIVE


def test_a_trial_that_ends_without_the_metric_fails_unless_it_is_optional(rig: Rig) -> None:
    spec = ASHA.replace("metric: acc", "metric: score")
    relaxed = ASHA.replace("metric: acc", "metric: score, require_metric: false")
    for text, expected in ((spec, TrialState.FAILED), (relaxed, TrialState.COMPLETED)):
        experiment_id = rig.experiments.submit(rig.admin, text, None, None).experiment.id
        trial_id = running_trials(rig, experiment_id)[0]
        rig.tracking.report_metrics(rig.admin, trial_id, 1, [(0, {"loss": 0.5})])
        rig.executor.exit(trial_id, 0)
        rig.tick()
        trial = rig.experiments.get_trial(rig.admin, trial_id).trial
        assert trial.state == expected
        if expected == TrialState.FAILED:
            assert trial.message is not None
            assert "searcher metric 'score' is not reported (this trial reports loss)" in (
                trial.message
            )
        rig.experiments.cancel_experiment(rig.admin, experiment_id)
