"""Metric points per trial per minute and in all, through the API (issue 24): a trial over
the minute gets 429 with Retry-After and nothing stored; past its total the rest is dropped
and counted; another trial and a user's token do not spend its budget."""

from __future__ import annotations

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api
from trainhub.core.metric_budget import PointCaps, PointWindow


def _batch(first: int, count: int) -> dict[str, object]:
    return {
        "attempt": 1,
        "points": [{"step": s, "values": {"loss": 0.5}} for s in range(first, first + count)],
    }


def test_a_trial_is_throttled_per_minute_and_capped_in_all(bapi: Api) -> None:
    tracking = bapi.services.tracking
    tracking.point_caps = PointCaps(per_minute=2000, per_trial=2500)
    tracking.point_window = PointWindow(tracking.point_caps)
    now = [1_800_000_000.0]
    tracking.clock = lambda: now[0]  # the minute passes when the test says so
    member = bapi.user("mia", "vision")
    trial_id = submit(bapi, member).json()["trials"][0]["id"]
    other_id = submit(bapi, member).json()["trials"][0]["id"]
    own = start_attempt(bapi, trial_id)
    other = start_attempt(bapi, other_id)
    url = f"/api/v1/trials/{trial_id}/metrics"
    # another trial's token is refused and spends nothing of this trial's minute
    for _ in range(3):
        assert bapi.client.post(url, json=_batch(0, 1000), headers=other).status_code == 404
    assert bapi.client.post(url, json=_batch(0, 1000), headers=own).status_code == 200
    assert bapi.client.post(url, json=_batch(1000, 1000), headers=own).status_code == 200
    refused = bapi.client.post(url, json=_batch(2000, 1000), headers=own)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "rate_limited"
    assert "more than 2000 metric points in the last minute" in refused.json()["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # the next minute: 500 more fit the total, 500 are dropped and counted
    now[0] += 61
    assert bapi.client.post(url, json=_batch(2000, 1000), headers=own).status_code == 200
    points = bapi.client.get(url, params={"limit": 5000}, headers=bapi.headers()).json()["data"]
    assert [p["step"] for p in points] == list(range(2500))
    writes = bapi.client.get(f"/api/v1/trials/{trial_id}", headers=bapi.headers()).json()["writes"]
    assert writes == {
        "metric_points": 2500,
        "metric_points_dropped": 500,
        "metric_requests_throttled": 1,
        "max_metric_points_per_minute": 2000,
        "max_metric_points_per_trial": 2500,
        "disk_bytes": 0,
    }
