"""Layer-health alerts: raised from the layers/* metrics a runtime reports, read by users."""

from __future__ import annotations

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api


def test_alerts_are_raised_from_layer_metrics_and_kept_with_first_and_last_step(
    api: Api,
) -> None:
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    url = f"/api/v1/trials/{trial_id}/metrics"
    healthy = {"layers/fc1/grad_norm": 0.5, "layers/fc2/grad_norm": 0.4, "loss": 1.0}
    points = [
        {"step": 0, "values": healthy},
        {"step": 10, "values": {**healthy, "layers/fc2/grad_norm": 4e4}},
        {"step": 20, "values": {**healthy, "layers/fc2/grad_norm": 5e4}},
    ]
    assert api.client.post(url, json={"points": points}, headers=own).status_code == 200
    nan = {"layers/fc1/nonfinite": 1.0, "loss": 2.0}
    # a retried batch adds nothing
    for _ in range(2):
        r = api.client.post(url, json={"points": [{"step": 30, "values": nan}]}, headers=own)
        assert r.status_code == 200
    # by the next sample NaN is everywhere: the alert keeps the layer where it appeared first
    later = {"points": [{"step": 40, "values": {"layers/fc0/nonfinite": 1.0}}]}
    assert api.client.post(url, json=later, headers=own).status_code == 200

    r = api.client.get(f"/api/v1/trials/{trial_id}/alerts", headers=api.headers(alice))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == 2
    exploding, nonfinite = body["data"]
    assert exploding["kind"] == "exploding_gradients"
    assert exploding["layer"] == "fc2"
    assert (exploding["step"], exploding["last_step"]) == (10, 20)
    assert exploding["value"] == 4e4
    assert "fc2" in exploding["message"]
    assert (nonfinite["kind"], nonfinite["layer"], nonfinite["step"]) == ("nonfinite", "fc1", 30)
    assert nonfinite["last_step"] == 40

    trial = api.client.get(f"/api/v1/trials/{trial_id}", headers=api.headers(alice)).json()
    assert [(a["kind"], a["layer"], a["step"]) for a in trial["alerts"]] == [
        ("exploding_gradients", "fc2", 10),
        ("nonfinite", "fc1", 30),
    ]
    # the trial's own token reads them too; another tenant's user does not
    assert api.client.get(f"/api/v1/trials/{trial_id}/alerts", headers=own).status_code == 200
    bob = api.user("bob", "speech")
    r = api.client.get(f"/api/v1/trials/{trial_id}/alerts", headers=api.headers(bob))
    assert r.status_code in (403, 404)


def test_a_trial_without_layer_metrics_has_no_alerts(api: Api) -> None:
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/metrics",
        json={"points": [{"step": 1, "values": {"loss": 1e9, "grad_norm": 1e9}}]},
        headers=own,
    )
    assert r.status_code == 200
    r = api.client.get(f"/api/v1/trials/{trial_id}/alerts", headers=api.headers(alice))
    assert r.json() == {"data": [], "count": 0}
    missing = api.client.get("/api/v1/trials/999/alerts", headers=api.headers(alice))
    assert missing.status_code == 404
    r = api.client.get(
        f"/api/v1/trials/{trial_id}/alerts", params={"limit": 0}, headers=api.headers(alice)
    )
    assert r.status_code == 422
