"""trainhub trials / pause / resume / kill / clone / limits against a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import start, submit
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.service.search import SearchService
from trainhub.service.steering import SteeringService

SEARCH = """
name: cli-search
entrypoint: python train.py
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  width: {type: int, low: 8, high: 64}
  epochs: 6
searcher: {sampler: random, metric: acc, max_trials: 4, max_concurrent_trials: 2, seed: 0}
"""


@pytest.fixture
def search(live: LiveServer, sqlite_url: str) -> Iterator[SearchService]:
    services = live.api.services
    backend = OptunaSearch.for_database(sqlite_url)
    uow = SqlSearchUnitOfWork(services.uow.engine)  # type: ignore[attr-defined]
    services.steering = SteeringService(
        uow, services.experiments, live.api.store, backend, services.clock
    )
    yield SearchService(uow, backend, live.api.store, services.clock)
    backend.storage.engine.dispose()


def test_trials_sorted_by_metric_with_hparams_as_columns(
    live: LiveServer, cli: Cli, search: SearchService
) -> None:
    experiment_id = submit(live, SEARCH)["id"]
    search.tick()
    rows = [
        json.loads(line) for line in cli("trials", str(experiment_id), "--json").output.splitlines()
    ]
    assert len(rows) == 2
    assert set(rows[0]) >= {"id", "state", "hparams", "metric", "epochs"}
    admin = live.api.services.authenticate(live.api.admin_token)
    for value, row in zip((0.3, 0.9), rows, strict=True):
        start(live, row["id"])
        live.api.services.tracking.record_metrics(admin, row["id"], 1, [(2, {"acc": value})])
    # a script that says how far it got (ctx.set_progress): its epochs done, not its step
    said = {"current": 3, "total": 4, "unit": "epochs"}
    live.api.services.tracking.record_metrics(admin, rows[1]["id"], 1, [], progress=said)
    rows = [
        json.loads(line) for line in cli("trials", str(experiment_id), "--json").output.splitlines()
    ]
    assert [r["metric"] for r in rows] == [0.9, 0.3]  # best first
    assert [r["epochs"] for r in rows] == [3, 2]  # the 0.9 trial said 3 epochs
    table = cli("trials", str(experiment_id)).output
    assert "2/4 trials" in table
    assert "best: trial" in table
    assert "lr" in table
    assert "width" in table
    # what the search does not vary is one line, not a column of each trial
    assert "same in every trial: epochs=6" in table
    assert "epochs" not in table.split("same in every trial")[1].split("\n", 1)[1]
    assert "2/4 trials: 0 done" in cli("show", str(experiment_id)).output
    csv_text = cli("trials", str(experiment_id), "--csv").output.splitlines()
    assert csv_text[0] == "trial,state,acc,done,lr,width,epochs,why"
    assert len(csv_text) == 3


def test_steer_from_the_command_line(live: LiveServer, cli: Cli, search: SearchService) -> None:
    experiment_id = submit(live, SEARCH)["id"]
    search.tick()
    first = json.loads(cli("trials", str(experiment_id), "--json").output.splitlines()[0])["id"]
    assert f"trial {first}: PAUSED" in cli("pause", str(first), "--trial").output
    assert f"trial {first}: QUEUED" in cli("resume", str(first), "--trial").output
    assert "paused" in cli("pause", str(experiment_id)).output
    assert "running" in cli("resume", str(experiment_id)).output
    out = cli("limits", str(experiment_id), "--max-trials", "9").output
    assert "/9 trials" in out
    cloned = cli("clone", str(experiment_id), "--set", "lr=0.05", "--set", "searcher.max_trials=3")
    assert cloned.exit_code == 0, cloned.output
    assert "submitted exp " in cloned.output
    bad = cli("clone", str(experiment_id), "--set", "lr")
    assert bad.exit_code == 2
    assert "PATH=VALUE" in bad.output
    wrong = cli("clone", str(experiment_id), "--set", "searcher.sampler=annealing")
    assert wrong.exit_code == 2  # a refusal of input (4xx)
    assert "searcher.sampler" in wrong.output
    typo = cli("clone", str(experiment_id), "--set", "epochs=six")  # a number made text
    assert typo.exit_code == 2
    assert "an integer is expected here (6)" in typo.output
    assert "epochs=6" in typo.output
    assert "type: float" not in typo.output
    assert "saved template" in cli("template", "save", "base", "--from", str(experiment_id)).output
    assert "default/base (with code" in cli("template", "ls").output
    submitted = cli("template", "submit", "base", "--set", "lr=0.05")
    assert "from template base" in submitted.output
    assert "CANCELED" in cli("kill", str(experiment_id)).output


def test_the_table_says_why_a_trial_was_pruned_in_few_words() -> None:
    from trainhub.cli.search import _short_why

    long = (
        "pruned by the asha pruner: val_accuracy=0.9276 at step 1 is not among the best of "
        "the trials at that step"
    )
    assert _short_why(long) == "asha at step 1 (0.9276)"
    assert _short_why("pruned by the median pruner: below the median") == (
        "median: below the median"
    )
    assert _short_why("paused by alice") == "paused by alice"
    assert _short_why(None) == ""


def test_one_id_space_an_experiment_or_a_trial(
    live: LiveServer, cli: Cli, search: SearchService
) -> None:
    searched = submit(live, SEARCH)["id"]
    search.tick()  # two trials
    single = submit(live)
    exp_id, trial_id = single["id"], single["trial_ids"][0]
    assert exp_id != trial_id  # the two id spaces differ here, as they do for users
    # an experiment with one trial stands for it
    for ref in (str(exp_id), f"exp/{exp_id}", f"trial/{trial_id}"):
        said = cli("metrics", ref)
        assert said.exit_code == 0, said.output
        assert f"trial {trial_id} has reported no metrics yet" in said.stderr
    assert f"trial {trial_id} has no attempts" in cli("logs", str(trial_id), "--trial").stderr
    # a search: which trial? its trials are listed, ready to copy
    which = cli("logs", str(searched))
    assert which.exit_code == 2
    assert f"exp {searched} has 2 trials; which one?" in which.stderr
    assert which.stderr.count("trainhub logs trial/") == 2
    for wrong in (["logs", "abc"], ["logs", f"exp/{exp_id}", "--trial"]):
        refused = cli(*wrong)
        assert refused.exit_code == 2, refused.output
        assert "error:" in refused.stderr
    assert cli("metrics", "9999").exit_code == 2  # an unknown experiment: a 404, refused input


def test_show_says_paused_and_an_ended_experiment_cannot_be_paused(
    live: LiveServer, cli: Cli, search: SearchService
) -> None:
    from tests.cli.helpers import finish

    searched = submit(live, SEARCH)["id"]
    search.tick()
    assert "ACTIVE" in cli("show", str(searched)).stdout
    assert cli("pause", str(searched)).exit_code == 0
    shown = cli("show", str(searched)).stdout
    assert "PAUSED" in shown
    assert "ACTIVE" not in shown
    assert cli("resume", str(searched)).exit_code == 0
    assert "ACTIVE" in cli("show", str(searched)).stdout

    single = submit(live)
    attempt = start(live, single["trial_ids"][0])
    finish(live, single["trial_ids"][0], attempt)
    for verb in ("pause", "resume"):
        refused = cli(verb, str(single["id"]))
        assert refused.exit_code == 2, refused.output
        assert f"experiment {single['id']} has ended (COMPLETED)" in refused.stderr
        assert f"nothing to {verb}" in refused.stderr
