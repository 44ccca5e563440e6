"""The searcher-metric warning on the API's trial and experiment, `trials`' progress, and the
dashboard's trial and experiment pages (a live server; HTML read over HTTP)."""

from __future__ import annotations

import html

from tests.api.test_auth import submit
from tests.web.conftest import Site
from tests.web.test_experiment_live import _session, _start
from trainhub.adapters.db.search_repository import SqlSearchUnitOfWork
from trainhub.adapters.optuna_search import OptunaSearch
from trainhub.service.search import SearchService

TYPO = """
name: typo
entrypoint: python train.py
hyperparameters:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
searcher: {sampler: random, metric: val_acc, mode: max, max_trials: 2, max_concurrent_trials: 2}
"""
WARNED = "did you mean 'val_accuracy'?"


def test_a_misspelt_metric_warns_on_every_surface(site: Site) -> None:
    api = site.api
    kim = api.user("kim", "vision")
    r = submit(api, kim, TYPO)
    assert r.status_code == 201, r.text
    experiment_id = r.json()["id"]
    engine = api.services.uow.engine  # type: ignore[attr-defined]
    backend = OptunaSearch.for_database(str(engine.url))
    try:  # the search's first tick makes its trials
        SearchService(SqlSearchUnitOfWork(engine), backend, api.store, api.services.clock).tick()
    finally:
        backend.storage.engine.dispose()
    trials = api.client.get(f"/api/v1/experiments/{experiment_id}", headers=api.headers(kim))
    trial_id = trials.json()["trials"][0]["id"]
    own = _start(site, trial_id)
    url = f"/api/v1/trials/{trial_id}/metrics"
    first = {"points": [{"step": 0, "values": {"train_loss": 0.9, "val_accuracy": 0.5}}]}
    assert api.client.post(url, json=first, headers=own).status_code == 200
    trial = api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(kim)).json()
    assert trial["warnings"] == []  # its first reports: the metric may still come
    later = {"points": [{"step": 1, "values": {"train_loss": 0.7, "val_accuracy": 0.6}}]}
    assert api.client.post(url, json=later, headers=own).status_code == 200

    trial = api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(kim)).json()
    assert len(trial["warnings"]) == 1
    assert WARNED in trial["warnings"][0]
    assert "this trial reports train_loss, val_accuracy" in trial["warnings"][0]
    experiment = api.client.get(
        f"/api/v1/experiments/{experiment_id}", headers=api.headers(kim)
    ).json()
    assert any(
        "no trial has reported searcher metric 'val_acc'" in w for w in experiment["warnings"]
    )
    progress = api.client.get(
        f"/api/v1/experiments/{experiment_id}/search", headers=api.headers(kim)
    ).json()
    assert any(WARNED in w for w in progress["warnings"])

    client = _session(site, kim)
    try:
        for page in (f"/ui/trials/{trial_id}", f"/ui/experiments/{experiment_id}"):
            text = html.unescape(client.get(page).text)
            assert 'id="metric-warning"' in text, page
            assert WARNED in text, page
    finally:
        client.close()
