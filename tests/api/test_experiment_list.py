"""The experiments list: filters by tenant and submitter, sorts by created, name and the best
value of the searcher's metric (its mode), bounded inputs; on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api


def _spec(name: str, mode: str = "max") -> str:
    return (
        f"name: {name}\nentrypoint: python train.py\n"
        f"searcher: {{metric: val_accuracy, mode: {mode}}}\n"
    )


def _report(api: Api, trial_id: int, values: list[float]) -> None:
    h = start_attempt(api, trial_id, 1)
    points = [{"step": i, "values": {"val_accuracy": v}} for i, v in enumerate(values)]
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"attempt": 1, "points": points}, headers=h
    )
    assert r.status_code == 200, r.text


def _list(api: Api, token: str, **params: Any) -> list[str]:
    r = api.client.get("/api/v1/experiments", params=params, headers=api.headers(token))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["data"])
    return [e["name"] for e in body["data"]]


def test_filters_and_sorts(api: Api) -> None:
    alice = api.user("alice", "vision")
    bob = api.user("bob", "vision")
    carol = api.user("carol", "speech")
    ids = {}
    for token, name, values in (
        (alice, "b-mid", [0.2, 0.6, 0.5]),  # its best is 0.6, not its latest 0.5
        (bob, "a-top", [0.9]),
        (alice, "c-none", []),
        (bob, "d-low", [0.1, 0.3]),
    ):
        r = submit(api, token, spec=_spec(name))
        assert r.status_code == 201, r.text
        ids[name] = r.json()["trials"][0]["id"]
        if values:
            _report(api, ids[name], values)
    assert submit(api, carol, spec=_spec("speech-x")).status_code == 201
    admin = api.admin_token
    # created: newest first by default, oldest first with asc
    assert _list(api, alice) == ["d-low", "c-none", "a-top", "b-mid"]
    assert _list(api, alice, order="asc") == ["b-mid", "a-top", "c-none", "d-low"]
    assert _list(api, alice, sort="name", order="asc") == ["a-top", "b-mid", "c-none", "d-low"]
    assert _list(api, alice, sort="name") == ["d-low", "c-none", "b-mid", "a-top"]
    # best: best first; asc worst first; without a value last in both orders
    assert _list(api, alice, sort="best") == ["a-top", "b-mid", "d-low", "c-none"]
    assert _list(api, alice, sort="best", order="asc") == ["d-low", "b-mid", "a-top", "c-none"]
    page = api.client.get(
        "/api/v1/experiments", params={"sort": "best", "limit": 1}, headers=api.headers(alice)
    ).json()
    assert page["count"] == 4
    assert page["data"][0]["best_value"] == 0.9
    # user (submitter) filter, combined with a sort and a page
    assert _list(api, alice, user="alice", sort="best") == ["b-mid", "c-none"]
    assert _list(api, alice, user="bob", sort="name", order="asc") == ["a-top", "d-low"]
    assert _list(api, alice, user="nobody") == []
    # tenant: among the visible tenants only; another tenant's name lists nothing, like an
    # unknown one (no error that tells it exists)
    assert _list(api, admin, tenant="speech") == ["speech-x"]
    assert len(_list(api, admin, tenant="vision")) == 4
    assert _list(api, alice, tenant="vision", user="bob") == ["d-low", "a-top"]
    assert _list(api, alice, tenant="speech") == []
    assert _list(api, alice, tenant="no-such-tenant") == []
    assert _list(api, carol, tenant="vision", sort="best") == []


def test_min_mode_sorts_lowest_first(api: Api) -> None:
    alice = api.user("alice", "vision")
    for name, values in (("hi", [0.8, 0.7]), ("lo", [0.5, 0.2, 0.4]), ("mid", [0.6])):
        r = submit(api, alice, spec=_spec(name, "min"))
        _report(api, r.json()["trials"][0]["id"], values)
    assert _list(api, alice, sort="best") == ["lo", "mid", "hi"]
    data = api.client.get(
        "/api/v1/experiments", params={"sort": "best"}, headers=api.headers(alice)
    ).json()["data"]
    assert [e["best_value"] for e in data] == [0.2, 0.6, 0.7]


def test_bad_sort_order_and_long_filters_are_422_with_the_field(api: Api) -> None:
    alice = api.user("alice", "vision")
    for params, field in (
        ({"sort": "loss"}, "sort"),
        ({"order": "up"}, "order"),
        ({"tenant": "t" * 65}, "tenant"),
        ({"user": "u" * 65}, "user"),
    ):
        r = api.client.get("/api/v1/experiments", params=params, headers=api.headers(alice))
        assert r.status_code == 422, r.text
        paths = {e["path"] for e in r.json()["errors"]}
        assert any(p.endswith(field) for p in paths), paths
