"""Queue order, priority changes, tenant shares and usage through the API."""

from __future__ import annotations

import pytest

from tests.api.test_auth import submit
from tests.fixtures.api import Api
from trainhub.core.resources import Node
from trainhub.core.states import TrialState
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial


def test_queue_lists_visible_trials_in_order_with_reasons(api: Api) -> None:
    alice = api.user("alice", "vision")
    bob = api.user("bob", "speech")
    first = submit(api, alice).json()["trials"][0]["id"]
    second = submit(api, alice).json()["trials"][0]["id"]
    submit(api, bob)
    with api.services.uow() as repo:
        repo.update_trial(
            first, TrialUpdate(queue_position=2, pending_reason="waiting behind trial 9")
        )
        repo.update_trial(
            second, TrialUpdate(queue_position=1, pending_reason="waiting for resources")
        )
    r = api.client.get("/api/v1/queue", headers=api.headers(alice))
    assert r.status_code == 200
    data = r.json()["data"]
    assert [t["id"] for t in data] == [second, first]
    assert data[0]["queue_position"] == 1
    assert data[0]["pending_reason"] == "waiting for resources"
    assert api.client.get("/api/v1/queue", headers=api.headers()).json()["count"] == 3


def test_priority_changes(api: Api) -> None:
    alice = api.user("alice", "vision")
    viewer = api.user("carl", "vision", role="viewer")
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    url = f"/api/v1/trials/{trial_id}"
    r = api.client.patch(url, json={"priority": "high"}, headers=api.headers(alice))
    assert r.status_code == 200
    assert r.json()["priority"] == "high"
    bad = api.client.patch(url, json={"priority": "asap"}, headers=api.headers(alice))
    assert bad.status_code == 400
    assert "low, normal, high" in bad.json()["hint"]
    urgent = api.client.patch(url, json={"priority": "urgent"}, headers=api.headers(alice))
    assert urgent.status_code == 403
    assert (
        api.client.patch(url, json={"priority": "low"}, headers=api.headers(viewer)).status_code
        == 403
    )
    assert (
        api.client.patch(url, json={"priority": "urgent"}, headers=api.headers()).status_code == 200
    )


def test_tenant_limit_below_guarantee_is_refused(api: Api) -> None:
    h = api.headers()
    r = api.client.post(
        "/api/v1/tenants", json={"name": "x", "guaranteed_slots": 8, "limit_slots": 4}, headers=h
    )
    assert r.status_code == 400
    assert "below the guarantee" in r.json()["message"]
    assert (
        api.client.post(
            "/api/v1/tenants", json={"name": "x", "guaranteed_slots": 8}, headers=h
        ).status_code
        == 201
    )
    r = api.client.patch("/api/v1/tenants/x", json={"limit_slots": 2}, headers=h)
    assert r.status_code == 400


def test_usage_counts_slot_hours_of_attempts(api: Api) -> None:
    alice = api.user("alice", "vision")
    h = api.headers()
    api.client.patch("/api/v1/tenants/vision", json={"guaranteed_slots": 4}, headers=h)
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    now = api.services.clock()
    with api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        attempt = repo.add_attempt(trial_id, 1, "t-a1", ["n"], None, None, now - 7200, num_slots=2)
        repo.update_attempt(attempt.id, AttemptUpdate(ended_at=now - 3600, outcome="SUCCEEDED"))
    r = api.client.get(
        "/api/v1/usage", params={"since": now - 4 * 3600}, headers=api.headers(alice)
    )
    assert r.status_code == 200
    body = r.json()
    assert sum(row["slot_hours"] for row in body["data"]) == 2.0
    assert body["data"][0]["user"] == "alice"
    (share,) = [t for t in body["tenants"] if t["tenant"] == "vision"]
    assert share["average_slots"] == pytest.approx(0.5, rel=1e-3)  # 2 slot-hours over 4 h
    assert share["share_of_guarantee"] == pytest.approx(0.125, rel=1e-3)
    csv = api.client.get(
        "/api/v1/usage", params={"since": now - 4 * 3600, "format": "csv"}, headers=h
    )
    assert csv.text.splitlines()[0] == (
        "day,tenant,user,project,slot_hours,inter_node_sent_bytes,inter_node_received_bytes,"
        "intra_node_bytes"
    )
    # another tenant's member sees none of it
    bob = api.user("bob", "speech")
    assert (
        api.client.get(
            "/api/v1/usage", params={"since": now - 4 * 3600}, headers=api.headers(bob)
        ).json()["data"]
        == []
    )


def test_queue_says_when_guarantees_exceed_the_cluster(api: Api) -> None:
    alice = api.user("alice", "vision")
    api.user("bob", "speech")
    h = api.headers()
    # no cluster to ask: no note
    assert api.client.get("/api/v1/queue", headers=api.headers(alice)).json()["note"] is None
    api.services.experiments.cluster_nodes = lambda: [
        Node("node-a", total_gpus=0, total_cpus=8.0, free_gpus=0, free_cpus=8.0),
        Node("node-b", total_gpus=0, total_cpus=4.0, free_gpus=0, free_cpus=4.0),
    ]
    assert api.client.get("/api/v1/queue", headers=api.headers(alice)).json()["note"] is None
    for tenant in ("vision", "speech"):  # 16 slots guaranteed on a cluster of 12 CPUs
        r = api.client.patch(f"/api/v1/tenants/{tenant}", json={"guaranteed_slots": 8}, headers=h)
        assert r.status_code == 200
    note = api.client.get("/api/v1/queue", headers=api.headers(alice)).json()["note"]
    assert note is not None
    assert "add up to 16 CPUs" in note  # a cluster without GPUs counts CPUs
    assert "cluster's 12" in note
    assert "scaled down by 0.75" in note
