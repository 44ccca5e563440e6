"""The search tick on real SQLite (ours and Optuna's), driven one control-loop tick at a time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.service.search_rig import Rig, build_rig
from trainhub.core.states import ExperimentState, TrialState
from trainhub.runtime import protocol
from trainhub.service.ports import Principal
from trainhub.service.records import Trial
from trainhub.service.search import study_config
from trainhub.service.search_ports import SearchState

ASHA = """
name: asha
entrypoint: python -m train
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  epochs: 9
searcher: {sampler: random, pruner: asha, metric: acc, max_trials: 12, max_concurrent_trials: 3,
           budget: {min: 1, max: 9}, reduction_factor: 3, seed: 1}
max_restarts: 0
"""


def accuracy(hparams: dict[str, Any], step: int) -> float:
    """Best at lr = 0.01; grows with the steps trained."""
    quality = 1.0 - abs(math.log10(hparams["lr"]) + 2.0) / 3.0
    return quality * (1.0 - 0.5**step)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return build_rig(f"sqlite:///{tmp_path / 'trainhub.db'}", tmp_path)


def trials_of(rig: Rig, experiment_id: int) -> list[Trial]:
    return rig.experiments.get(rig.admin, experiment_id).trials


def submit_asha(rig: Rig, max_trials: int, max_concurrent_trials: int) -> int:
    """The ASHA search with other limits; its experiment id."""
    spec = ASHA.replace(
        "max_trials: 12, max_concurrent_trials: 3",
        f"max_trials: {max_trials}, max_concurrent_trials: {max_concurrent_trials}",
    )
    return rig.experiments.submit(rig.admin, spec, None, None).experiment.id


def train_one_step(
    rig: Rig, steps: dict[int, int], max_step: int, checkpoint: bool = False
) -> None:
    """Every running fake process reports its next step (and exits after the last one); like a
    script that polls ctx.should_stop(), it exits 0 once the control plane says stop."""
    for trial_id, attempt in rig.executor.running().items():
        if rig.tracking.signals(rig.admin, trial_id)[0]:
            rig.executor.exit(trial_id, 0)
            continue
        step = steps.get(trial_id, 0) + 1
        steps[trial_id] = step
        hparams = rig.experiments.get_trial(rig.admin, trial_id).trial.hparams
        rig.tracking.record_metrics(
            rig.admin, trial_id, attempt.launch.attempt, [(step, {"acc": accuracy(hparams, step)})]
        )
        if checkpoint:
            rig.tracking.register_checkpoint(
                rig.admin, trial_id, f"t{trial_id}-s{step}", step, attempt.launch.attempt, {}, b"x"
            )
        if step >= max_step:
            rig.executor.exit(trial_id, 0)


def study_trials(rig: Rig, experiment_id: int) -> list[optuna.trial.FrozenTrial]:
    spec = rig.experiments.spec_of(rig.experiments.get(rig.admin, experiment_id).experiment)
    name = study_config(experiment_id, spec).name
    return optuna.load_study(study_name=name, storage=rig.backend.storage).get_trials()


def test_asha_search_prunes_keeps_concurrency_and_survives_a_restart(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, ASHA, None, None).experiment.id
    assert trials_of(rig, experiment_id) == []  # the searcher makes them
    steps: dict[int, int] = {}
    most_live = 0
    stop_reasons: dict[int, str] = {}
    for tick in range(200):
        if tick == 20:  # the control plane dies and comes back; the fake processes go on
            rig = rig.restart()
        rig.tick()
        trials = trials_of(rig, experiment_id)
        live = [t for t in trials if not t.state.is_terminal]
        most_live = max(most_live, len(live))
        assert len(live) <= 3
        for trial in live:
            stop, reason = rig.tracking.signals(rig.admin, trial.id)
            if stop and reason:
                stop_reasons[trial.id] = reason
        if rig.experiments.get(rig.admin, experiment_id).experiment.state != ExperimentState.ACTIVE:
            break
        train_one_step(rig, steps, max_step=9)
    detail = rig.experiments.get(rig.admin, experiment_id)
    assert detail.experiment.state == ExperimentState.COMPLETED
    states = [t.state for t in detail.trials]
    assert len(states) == 12
    assert most_live == 3
    pruned = [t for t in detail.trials if t.state == TrialState.PRUNED]
    completed = [t for t in detail.trials if t.state == TrialState.COMPLETED]
    assert pruned
    assert completed
    assert len(pruned) + len(completed) == 12
    # the runtime of a pruned trial was told why before it ended
    for trial in pruned:
        assert stop_reasons[trial.id].startswith("pruned by the asha pruner")
        assert trial.message is not None
        assert "pruned" in trial.message
    # Optuna saw each trial once, and how it ended
    in_study = study_trials(rig, experiment_id)
    assert len(in_study) == 12
    assert len({t.number for t in in_study}) == 12
    counts = {s: sum(1 for t in in_study if t.state == s) for s in optuna.trial.TrialState}
    assert counts[optuna.trial.TrialState.PRUNED] == len(pruned)
    assert counts[optuna.trial.TrialState.COMPLETE] == len(completed)
    assert rig.steering.progress(rig.admin, experiment_id).search is not None
    progress = rig.steering.progress(rig.admin, experiment_id)
    assert progress.search is not None
    assert progress.search.state == SearchState.FINISHED
    assert progress.best is not None
    assert progress.best.trial.state == TrialState.COMPLETED
    assert progress.results[0] == progress.best


def test_a_point_asked_before_a_crash_is_adopted_not_asked_again(rig: Rig) -> None:
    experiment_id = submit_asha(rig, max_trials=3, max_concurrent_trials=2)
    rig.tick()
    assert len(trials_of(rig, experiment_id)) == 2
    # the control plane asked Optuna, then died before writing the trial row
    config = study_config(
        experiment_id,
        rig.experiments.spec_of(rig.experiments.get(rig.admin, experiment_id).experiment),
    )
    orphan = rig.backend.ask(
        config,
        rig.experiments.spec_of(
            rig.experiments.get(rig.admin, experiment_id).experiment
        ).search_space,
    )
    rig = rig.restart()
    first = trials_of(rig, experiment_id)[0]
    rig.executor.exit(first.id, 0)
    rig.tick()
    trials = trials_of(rig, experiment_id)
    assert len(trials) == 3
    assert trials[-1].hparams["lr"] == orphan.params["lr"]
    assert len(study_trials(rig, experiment_id)) == 3


def test_a_failed_trial_is_retried_then_told_as_failed(rig: Rig) -> None:
    spec = ASHA.replace("max_trials: 12", "max_trials: 1").replace(
        "max_restarts: 0", "max_restarts: 1"
    )
    experiment_id = rig.experiments.submit(rig.admin, spec, None, None).experiment.id
    for _ in range(2):
        rig.tick()
        (trial,) = trials_of(rig, experiment_id)
        rig.executor.exit(trial.id, 1)
        rig.tick()
    rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    assert trial.state == TrialState.FAILED
    assert trial.num_restarts == 1
    (told,) = study_trials(rig, experiment_id)
    assert told.state == optuna.trial.TrialState.FAIL


SINGLE = """
name: single
entrypoint: python -m train
hyperparameters: {lr: 0.01, epochs: 9}
searcher: {metric: acc}
"""


def test_pause_and_resume_a_running_trial(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, SINGLE, None, None).experiment.id
    rig.tick()
    rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    assert trial.state == TrialState.RUNNING
    checkpoint = rig.tracking.register_checkpoint(rig.admin, trial.id, "c1", 3, 1, {}, b"state")
    paused = rig.steering.pause_trial(rig.admin, trial.id)
    assert paused.state == TrialState.PREEMPTING
    assert rig.tracking.signals(rig.admin, trial.id) == (True, "paused by admin")
    rig.executor.exit(trial.id, 0)  # the script saw should_stop, checkpointed and left
    for _ in range(3):
        rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    assert trial.state == TrialState.PAUSED
    assert len(rig.executor.attempts) == 1  # its slots are free; nothing relaunched
    rig.steering.resume_trial(rig.admin, trial.id)
    rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    assert trial.state in (TrialState.SCHEDULED, TrialState.RUNNING)
    relaunch = rig.executor.running()[trial.id].launch
    assert relaunch.attempt == 2
    assert relaunch.env[protocol.ENV_RESTORE_CHECKPOINT] == str(checkpoint.id)


def test_pausing_a_search_stops_new_trials_until_resumed(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, ASHA, None, None).experiment.id
    rig.tick()
    rig.tick()
    rig.steering.pause_experiment(rig.admin, experiment_id)
    for trial in trials_of(rig, experiment_id):
        rig.executor.exit(trial.id, 0)
    for _ in range(3):
        rig.tick()
    trials = trials_of(rig, experiment_id)
    assert [t.state for t in trials] == [TrialState.PAUSED] * 3
    progress = rig.steering.resume_experiment(rig.admin, experiment_id)
    assert progress.search is not None
    assert progress.search.state == SearchState.RUNNING
    rig.tick()
    assert all(t.state == TrialState.SCHEDULED for t in trials_of(rig, experiment_id))
    rig.steering.set_limits(rig.admin, experiment_id, max_trials=None, max_concurrent_trials=5)
    rig.tick()
    assert len(trials_of(rig, experiment_id)) == 5


def test_a_trial_that_trained_its_whole_budget_is_not_pruned(rig: Rig) -> None:
    """Found end to end: a trial whose last report (step 9 of 9) came after a better trial's
    ended PRUNED at the budget's rung although it had nothing left to train."""
    experiment_id = submit_asha(rig, max_trials=2, max_concurrent_trials=2)
    rig.tick()
    rig.tick()
    good, bad = sorted(rig.executor.running())
    for trial_id, quality in ((good, 0.9), (bad, 0.1)):
        points = [(step, {"acc": quality * (1 - 0.5**step)}) for step in range(1, 10)]
        rig.tracking.record_metrics(rig.admin, trial_id, 1, points)
        rig.tick()
    assert rig.tracking.signals(rig.admin, bad) == (False, None)
    rig.executor.exit(good)
    rig.executor.exit(bad)
    for _ in range(3):
        rig.tick()
    states = {t.id: t.state for t in trials_of(rig, experiment_id)}
    assert states == {good: TrialState.COMPLETED, bad: TrialState.COMPLETED}


PBT = """
name: pbt
entrypoint: python -m train
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
searcher: {name: pbt, metric: acc, population: 4, perturbation_interval: 2, quantile: 0.25,
           budget: {max: 6}, max_trials: 6, seed: 3}
"""


def test_pbt_replaces_the_worst_member_from_a_donor_checkpoint(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, PBT, None, None).experiment.id
    steps: dict[int, int] = {}
    rig.tick()
    assert len(trials_of(rig, experiment_id)) == 4
    restored: dict[int, tuple[int, bytes, str]] = {}  # child -> (checkpoint, data, uuid)
    for _ in range(8):
        rig.tick()
        for trial_id, attempt in rig.executor.running().items():
            if trial_id > 4 and trial_id not in restored:  # a new member was just launched
                restore = int(attempt.launch.env[protocol.ENV_RESTORE_CHECKPOINT])
                (copy,) = [
                    c for c in rig.tracking.list_checkpoints(rig.admin, trial_id) if c.id == restore
                ]
                data = rig.tracking.checkpoint_data(rig.admin, trial_id, restore)
                restored[trial_id] = (restore, data, copy.uuid)
        train_one_step(rig, steps, max_step=6, checkpoint=True)
    trials = {t.id: t for t in trials_of(rig, experiment_id)}
    replaced = [t for t in trials.values() if t.state == TrialState.PRUNED]
    assert replaced
    assert replaced[0].message is not None
    assert "pbt" in replaced[0].message
    assert restored, "a replacement member was launched"
    child_id, (_, data, uuid) = next(iter(restored.items()))
    progress = {r.trial.id: r for r in rig.steering.progress(rig.admin, experiment_id).results}
    donor = trials[progress[child_id].parent_trial_id or 0]
    assert trials[child_id].hparams["lr"] != donor.hparams["lr"]  # perturbed or resampled
    # it restored its own copy of the donor's checkpoint (the donor's own may be gone by now)
    assert uuid.startswith(f"pbt-{child_id}-t{donor.id}-s")
    assert data == b"x"


def test_clone_with_changes_warm_starts_from_a_trial(rig: Rig) -> None:
    experiment_id = rig.experiments.submit(rig.admin, SINGLE, None, None).experiment.id
    rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    checkpoint = rig.tracking.register_checkpoint(rig.admin, trial.id, "c9", 9, 1, {}, b"w")
    clone = rig.steering.clone_experiment(
        rig.admin, experiment_id, {"lr": 0.5, "max_restarts": 0}, from_trial=trial.id
    )
    (cloned,) = clone.trials
    assert cloned.hparams == {"lr": 0.5, "epochs": 9}
    assert clone.experiment.spec["max_restarts"] == 0
    assert clone.experiment.spec["searcher"]["source_checkpoint_id"] == checkpoint.id
    rig.tick()
    launch = rig.executor.running()[cloned.id].launch
    assert launch.env[protocol.ENV_RESTORE_CHECKPOINT] == str(checkpoint.id)
    # the clone's own token may download the checkpoint of the trial it starts from
    as_clone = Principal(None, f"trial-{cloned.id}", trial_id=cloned.id)
    assert rig.tracking.checkpoint_data(as_clone, cloned.id, checkpoint.id) == b"w"


def test_grid_search_ends_when_the_grid_is_done(rig: Rig) -> None:
    spec = """
name: grid
entrypoint: python -m train
hyperparameters: {lr: {type: categorical, choices: [0.001, 0.01, 0.1]}}
searcher: {sampler: grid, metric: acc, max_concurrent_trials: 2}
"""
    experiment_id = rig.experiments.submit(rig.admin, spec, None, None).experiment.id
    steps: dict[int, int] = {}
    for _ in range(30):
        rig.tick()
        train_one_step(rig, steps, max_step=2)
    detail = rig.experiments.get(rig.admin, experiment_id)
    assert sorted(t.hparams["lr"] for t in detail.trials) == [0.001, 0.01, 0.1]
    assert detail.experiment.state == ExperimentState.COMPLETED
    progress = rig.steering.progress(rig.admin, experiment_id)
    assert progress.search is not None
    assert progress.search.state == SearchState.FINISHED
    assert progress.best is not None
    assert progress.best.trial.hparams["lr"] == 0.01


def test_a_search_stays_active_between_its_trials(rig: Rig) -> None:
    """The last running trial ends before the next tick makes more: still ACTIVE, not done."""
    from trainhub.service.experiments import refresh_experiment_state

    experiment_id = submit_asha(rig, max_trials=4, max_concurrent_trials=1)
    rig.tick()
    rig.tick()
    (trial,) = trials_of(rig, experiment_id)
    rig.tracking.record_metrics(rig.admin, trial.id, 1, [(9, {"acc": 0.5})])
    rig.executor.exit(trial.id, 0)
    rig.loop.hooks = None  # the loop ends the trial; the search tick has not run yet
    rig.tick()
    assert trials_of(rig, experiment_id)[0].state == TrialState.COMPLETED
    with rig.experiments.uow() as repo:
        refresh_experiment_state(repo, experiment_id, rig.clock())
    state = rig.experiments.get(rig.admin, experiment_id).experiment.state
    assert state == ExperimentState.ACTIVE


def test_raising_max_trials_revives_a_finished_search(rig: Rig) -> None:
    experiment_id = submit_asha(rig, max_trials=2, max_concurrent_trials=2)
    rig.tick()
    rig.tick()
    for trial in trials_of(rig, experiment_id):
        rig.executor.exit(trial.id, 0)
    for _ in range(3):
        rig.tick()
    finished = rig.steering.progress(rig.admin, experiment_id).search
    assert finished is not None
    assert finished.state == SearchState.FINISHED
    revived = rig.steering.set_limits(
        rig.admin, experiment_id, max_trials=3, max_concurrent_trials=None
    ).search
    assert revived is not None
    assert (revived.state, revived.max_trials, revived.max_concurrent_trials) == (
        SearchState.RUNNING,
        3,
        2,
    )
    rig.tick()
    assert len(trials_of(rig, experiment_id)) == 3
