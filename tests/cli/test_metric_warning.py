"""`trainhub show` and `trainhub trials` say when the searcher's metric is not reported."""

from __future__ import annotations

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import start, submit
from tests.cli.test_search import search  # noqa: F401  (the fixture)
from trainhub.service.search import SearchService

TYPO = """
name: cli-typo
entrypoint: python train.py
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
searcher: {sampler: random, metric: val_acc, max_trials: 1, seed: 0}
"""


def test_show_and_trials_warn_with_did_you_mean(
    live: LiveServer,
    cli: Cli,
    search: SearchService,  # noqa: F811
) -> None:
    experiment_id = submit(live, TYPO)["id"]
    search.tick()
    experiment = live.api.client.get(
        f"/api/v1/experiments/{experiment_id}", headers=live.api.headers()
    ).json()
    trial_id = experiment["trials"][0]["id"]
    start(live, trial_id)
    admin = live.api.services.authenticate(live.api.admin_token)
    points = [(step, {"val_accuracy": 0.5, "train_loss": 1.0}) for step in (0, 1)]
    live.api.services.tracking.record_metrics(admin, trial_id, 1, points)
    shown = " ".join(cli("show", str(experiment_id)).output.split())
    assert "warning" in shown
    assert "searcher metric 'val_acc' is not reported" in shown
    assert "did you mean 'val_accuracy'?" in shown
    listed = " ".join(cli("trials", str(experiment_id)).output.split())
    assert "warning: no trial has reported searcher metric 'val_acc'" in listed
    assert "did you mean 'val_accuracy'?" in listed
