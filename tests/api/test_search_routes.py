"""Search and steering routes on SQLite and PostgreSQL (Optuna's storage beside ours)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_auth import submit
from tests.fixtures.api import Api, build_api
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.core.states import TrialState
from trainhub.service.records import TrialUpdate
from trainhub.service.search import SearchService
from trainhub.service.steering import SteeringService
from trainhub.service.trial_writes import write_trial

SEARCH = """
name: lr-search
entrypoint: python train.py
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  optimizer:
    type: categorical
    choices: [sgd, {value: adam, params: {beta1: {type: float, low: 0.8, high: 0.99}}}]
searcher: {sampler: tpe, pruner: median, metric: acc, max_trials: 6, max_concurrent_trials: 2}
"""


@pytest.fixture
def search_api(db_url: str, tmp_path: Path) -> Iterator[tuple[Api, SearchService]]:
    built = build_api(db_url, tmp_path)
    services = built.services
    engine = services.uow.engine  # type: ignore[attr-defined]
    backend = OptunaSearch.for_database(db_url)
    search_uow = SqlSearchUnitOfWork(engine)
    services.steering = SteeringService(
        search_uow, services.experiments, built.store, backend, services.clock
    )
    search = SearchService(search_uow, backend, built.store, services.clock)
    with built.client:
        yield built, search
    engine.dispose()
    backend.storage.engine.dispose()


def _post(api: Api, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
    return api.client.post(f"/api/v1{path}", json=body, headers=api.headers(token))


def test_search_lifecycle_through_the_api(search_api: tuple[Api, SearchService]) -> None:
    api, search = search_api
    token = api.user("alice", "vision")
    r = submit(api, token, SEARCH)
    assert r.status_code == 201, r.text
    experiment_id = r.json()["id"]
    assert r.json()["trials"] == []
    search.tick()  # the control loop's search tick makes the first trials
    progress = api.client.get(
        f"/api/v1/experiments/{experiment_id}/search", headers=api.headers(token)
    ).json()
    assert progress["search_state"] == "RUNNING"
    assert progress["counts"] == {"QUEUED": 2}
    assert progress["max_concurrent_trials"] == 2
    first = progress["data"][0]
    assert set(first) >= {"id", "state", "hparams", "metric", "epochs"}
    if first["hparams"]["optimizer"] == "adam":
        assert 0.8 <= first["hparams"]["beta1"] <= 0.99

    # pause and resume one trial (queued: no checkpoint to take)
    paused = _post(api, f"/trials/{first['id']}/pause", token)
    assert paused.status_code == 200, paused.text
    assert paused.json()["state"] == "PAUSED"
    again = _post(api, f"/trials/{first['id']}/pause", token)
    assert again.json()["state"] == "PAUSED"
    assert _post(api, f"/trials/{first['id']}/resume", token).json()["state"] == "QUEUED"
    not_paused = _post(api, f"/trials/{first['id']}/resume", token)
    assert not_paused.status_code == 409
    assert "not paused" in not_paused.json()["message"]

    # raise the concurrency of the running search
    r = api.client.patch(
        f"/api/v1/experiments/{experiment_id}/search",
        json={"max_concurrent_trials": 3},
        headers=api.headers(token),
    )
    assert r.status_code == 200, r.text
    search.tick()
    assert (
        len(
            api.client.get(
                f"/api/v1/experiments/{experiment_id}", headers=api.headers(token)
            ).json()["trials"]
        )
        == 3
    )
    bad = api.client.patch(
        f"/api/v1/experiments/{experiment_id}/search",
        json={"max_trials": 0},
        headers=api.headers(token),
    )
    assert bad.status_code == 422

    # pause the whole experiment: no new trials while paused
    body = _post(api, f"/experiments/{experiment_id}/pause", token).json()
    assert body["search_state"] == "PAUSED"
    assert body["counts"] == {"PAUSED": 3}
    body = _post(api, f"/experiments/{experiment_id}/resume", token).json()
    assert body["counts"] == {"QUEUED": 3}

    # kill one trial, then the experiment
    assert _post(api, f"/trials/{first['id']}/kill", token).json()["state"] == "CANCELED"
    killed = _post(api, f"/experiments/{experiment_id}/kill", token).json()
    assert {t["state"] for t in killed["trials"]} == {"CANCELED"}
    search.tick()
    progress = api.client.get(
        f"/api/v1/experiments/{experiment_id}/search", headers=api.headers(token)
    ).json()
    assert progress["search_state"] == "KILLED"
    assert progress["count"] == 3  # no trial was made after the kill
    importance = api.client.get(
        f"/api/v1/experiments/{experiment_id}/importance", headers=api.headers(token)
    )
    assert importance.json() == {"importance": {}}


def test_clone_with_changes(search_api: tuple[Api, SearchService]) -> None:
    api, search = search_api
    token = api.user("alice", "vision")
    experiment_id = submit(api, token, SEARCH).json()["id"]
    r = _post(
        api,
        f"/experiments/{experiment_id}/clone",
        token,
        {"set": {"searcher.max_trials": 64, "lr": {"type": "float", "low": 0.01, "high": 0.1}}},
    )
    assert r.status_code == 201, r.text
    clone = r.json()
    assert clone["id"] != experiment_id
    search.tick()
    progress = api.client.get(
        f"/api/v1/experiments/{clone['id']}/search", headers=api.headers(token)
    ).json()
    assert progress["max_trials"] == 64
    assert all(0.01 <= t["hparams"]["lr"] <= 0.1 for t in progress["data"])

    # a trial cloned as a single run with its values as constants
    trial_id = progress["data"][0]["id"]
    r = _post(
        api, f"/trials/{trial_id}/clone", token, {"set": {"lr": 0.5}, "from_checkpoint": False}
    )
    assert r.status_code == 201, r.text
    (single,) = r.json()["trials"]
    assert single["hparams"]["lr"] == 0.5

    # mistakes are the user's, with the field and a fix
    bad = _post(
        api,
        f"/experiments/{experiment_id}/clone",
        token,
        {"set": {"lr": {"type": "float", "low": 1, "high": 0}}},
    )
    assert bad.status_code == 422
    assert [e["path"] for e in bad.json()["errors"]] == ["hyperparameters.lr.low"]
    no_checkpoint = _post(
        api, f"/experiments/{experiment_id}/clone", token, {"from_checkpoint_trial": trial_id}
    )
    assert no_checkpoint.status_code == 409
    assert "no checkpoint" in no_checkpoint.json()["message"]


def test_other_tenants_cannot_steer(search_api: tuple[Api, SearchService]) -> None:
    api, search = search_api
    alice = api.user("alice", "vision")
    bob = api.user("bob", "nlp")
    experiment_id = submit(api, alice, SEARCH).json()["id"]
    search.tick()
    assert _post(api, f"/experiments/{experiment_id}/pause", bob).status_code == 404
    assert (
        api.client.get(
            f"/api/v1/experiments/{experiment_id}/search", headers=api.headers(bob)
        ).status_code
        == 404
    )
    bad_space = submit(api, alice, SEARCH.replace("low: 0.8", "low: 1.8"))
    assert bad_space.status_code == 422
    assert [e["path"] for e in bad_space.json()["errors"]] == [
        "hyperparameters.optimizer.choices.1.params.beta1.low"
    ]


def test_templates_save_list_and_submit_with_changes(
    search_api: tuple[Api, SearchService],
) -> None:
    api, _ = search_api
    alice = api.user("alice", "vision")
    bob = api.user("bob", "nlp")
    experiment_id = submit(api, alice, SEARCH).json()["id"]
    r = _post(api, f"/experiments/{experiment_id}/template", alice, {"name": "lr-search"})
    assert r.status_code == 201, r.text
    assert r.json()["has_context"] is True
    listed = api.client.get("/api/v1/templates", headers=api.headers(alice)).json()
    assert [t["name"] for t in listed["data"]] == ["lr-search"]
    assert api.client.get("/api/v1/templates", headers=api.headers(bob)).json()["count"] == 0
    r = _post(api, "/templates/lr-search/submit", alice, {"set": {"searcher.max_trials": 2}})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["searcher"]["max_trials"] == 2
    missing = _post(api, "/templates/nope/submit", alice, {})
    assert missing.status_code == 404
    assert "trainhub template ls" in missing.json()["hint"]
    bad = api.client.post(
        "/api/v1/templates",
        data={"name": "broken", "spec": "name: x\nentrypoint: python -m t\nmax_restarts: -1\n"},
        headers=api.headers(alice),
    )
    assert bad.status_code == 422
    assert [e["path"] for e in bad.json()["errors"]] == ["max_restarts"]


def test_canceling_a_search_stops_it(search_api: tuple[Api, SearchService]) -> None:
    api, search = search_api
    token = api.user("alice", "vision")
    experiment_id = submit(api, token, SEARCH).json()["id"]
    search.tick()
    first = api.services.experiments.get(api.services.authenticate(token), experiment_id).trials[0]
    with api.services.uow() as repo:  # one trial ran to its end, as the control loop would say
        for state in (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.COMPLETED):
            write_trial(repo, first.id, TrialUpdate(state=state))
    r = _post(api, f"/experiments/{experiment_id}/cancel", token)
    assert r.status_code == 200, r.text
    search.tick()
    progress = api.client.get(
        f"/api/v1/experiments/{experiment_id}/search", headers=api.headers(token)
    ).json()
    assert progress["search_state"] == "KILLED"
    assert progress["counts"] == {"CANCELED": 1, "COMPLETED": 1}
    assert progress["count"] == 2  # no trial was made after the cancel
