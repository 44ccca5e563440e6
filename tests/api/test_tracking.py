"""Metrics, checkpoints and signals as the runtime reports them."""

from __future__ import annotations

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api
from trainhub.service.records import TrialUpdate
from trainhub.service.trial_writes import write_trial


def trial_token(api: Api, trial_id: int) -> dict[str, str]:
    h = start_attempt(api, trial_id, 1)
    start_attempt(api, trial_id, 2)
    return h


def test_metrics_upsert_per_step_and_latest(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    h = trial_token(api, trial_id)
    url = f"/api/v1/trials/{trial_id}/metrics"
    batch = {
        "attempt": 1,
        "points": [
            {"step": 0, "values": {"loss": 2.0}},
            {"step": 1, "values": {"loss": 1.0}},
            {"step": 1, "values": {"val_accuracy": 0.5}},
        ],
        "progress": {"current": 2, "total": 5, "unit": "epochs"},
    }
    assert api.client.post(url, json=batch, headers=h).status_code == 200
    # a retried batch and a restarted attempt re-reporting step 1: no duplicates
    assert api.client.post(url, json=batch, headers=h).status_code == 200
    again = {"attempt": 2, "points": [{"step": 1, "values": {"loss": 0.9}}]}
    assert api.client.post(url, json=again, headers=h).status_code == 200
    data = api.client.get(url, headers=api.headers(user)).json()["data"]
    assert [p["step"] for p in data] == [0, 1]
    assert data[1]["values"] == {"loss": 0.9}
    assert data[1]["attempt"] == 2
    trial = api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(user)).json()
    assert trial["latest_metrics"]["loss"] == 0.9
    assert trial["progress"] == {"current": 2, "total": 5, "unit": "epochs"}


def test_bad_metrics_are_422(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    h = trial_token(api, trial_id)
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/metrics",
        json={"points": [{"step": -1, "values": {"loss": "high"}}]},
        headers=h,
    )
    assert r.status_code == 422
    assert {e["path"] for e in r.json()["errors"]} >= {"points.0.step", "points.0.values.loss"}


def test_checkpoint_upload_is_idempotent_and_retention_keeps_latest(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(
        api, user, spec="name: demo\nentrypoint: python train.py\ncheckpoints: {keep_latest: 2}\n"
    ).json()["trials"][0]["id"]
    h = trial_token(api, trial_id)
    url = f"/api/v1/trials/{trial_id}/checkpoints"
    ids = []
    for step in range(4):
        r = api.client.post(
            url,
            params={"uuid": f"c{step}", "step": step, "metrics": '{"loss": 1}'},
            content=f"state {step}".encode(),
            headers=h,
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    retry = api.client.post(url, params={"uuid": "c3", "step": 3}, content=b"state 3", headers=h)
    assert retry.json()["id"] == ids[3]
    listed = api.client.get(url, headers=api.headers(user)).json()["data"]
    assert [c["step"] for c in listed] == [2, 3]
    r = api.client.get(f"{url}/{ids[3]}/file", headers=h)
    assert r.content == b"state 3"
    assert api.client.get(f"{url}/{ids[0]}/file", headers=h).status_code == 404
    bad = api.client.post(url, params={"uuid": "../x", "step": 1}, content=b"x", headers=h)
    assert bad.status_code == 422


def test_cancel_signals_a_running_trial(api: Api) -> None:
    from trainhub.core.states import TrialState

    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    with api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING))
    h = trial_token(api, trial_id)
    assert (
        api.client.get(f"/api/v1/trials/{trial_id}/signals", headers=h).json()["should_stop"]
        is False
    )
    r = api.client.post(f"/api/v1/trials/{trial_id}/cancel", headers=api.headers(user))
    assert r.status_code == 200
    assert r.json()["stop_requested"] == "canceled by alice"
    signals = api.client.get(f"/api/v1/trials/{trial_id}/signals", headers=h).json()
    assert signals == {"should_stop": True, "reason": "canceled by alice"}


def test_64_bit_steps_are_stored_on_every_database(api: Api) -> None:
    user = api.user("alice", "vision")
    trial_id = submit(api, user).json()["trials"][0]["id"]
    h = trial_token(api, trial_id)
    big = 2**63 - 1
    body = {"points": [{"step": big, "values": {"loss": 1.0}}]}
    assert (
        api.client.post(f"/api/v1/trials/{trial_id}/metrics", json=body, headers=h).status_code
        == 200
    )
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": "big-step", "step": big},
        content=b"x",
        headers=h,
    )
    assert r.status_code == 201, r.text
    assert r.json()["step"] == big
    points = api.client.get(f"/api/v1/trials/{trial_id}/metrics", headers=api.headers(user)).json()
    assert points["data"][0]["step"] == big
