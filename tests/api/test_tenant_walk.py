"""Every route, called with another tenant's tokens of every role (and its trial's token) on
tenant A's objects: 403 or 404, and A's objects appear in no listing."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import build_bounded_api
from tests.api.test_auth import SPEC, submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api


@dataclass(frozen=True)
class World:
    api: Api
    ids: dict[str, Any]  # path parameter -> tenant A's object
    outsiders: dict[str, dict[str, str]]  # who -> headers


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    api = build_bounded_api(Path(tmp_path_factory.mktemp("walk")))
    with api.client:
        alice = api.user("alice", "vision")
        experiment = submit(api, alice).json()
        trial_id = experiment["trials"][0]["id"]
        submit(api, alice)  # a second one stays QUEUED: the queue must not show it
        own = start_attempt(api, trial_id)
        # a layer-health alert (GET /trials/{trial_id}/alerts) that outsiders must not read
        metrics = {"points": [{"step": 1, "values": {"loss": 1.0, "layers/fc/nonfinite": 1.0}}]}
        assert api.client.post(f"/api/v1/trials/{trial_id}/metrics", json=metrics, headers=own)
        r = api.client.post(
            f"/api/v1/trials/{trial_id}/checkpoints",
            params={"uuid": "a-ckpt", "step": 1},
            content=b"state",
            headers=own,
        )
        assert r.status_code == 201, r.text
        checkpoint_id = r.json()["id"]
        r = api.client.post(
            "/api/v1/models",
            json={"trial_id": trial_id, "name": "a-model"},
            headers=api.headers(alice),
        )
        assert r.status_code == 201, r.text
        r = api.client.post(
            f"/api/v1/trials/{trial_id}/samples", json=_samples("a-samples"), headers=own
        )
        assert r.status_code == 204, r.text
        # a dataset of tenant A (named as the tenant: the walk's {name} serves both)
        r = api.client.put(
            "/api/v1/datasets/vision/archive",
            params={"sha256": hashlib.sha256(_DATASET).hexdigest()},
            content=_DATASET,
            headers=api.headers(alice),
        )
        assert r.status_code == 201, r.text
        token_id = api.client.get("/api/v1/tokens", headers=api.headers(alice)).json()["data"][0][
            "id"
        ]
        profile = api.client.post(
            f"/api/v1/trials/{trial_id}/profiles", json={"steps": 5}, headers=api.headers(alice)
        )
        assert profile.status_code == 201, profile.text
        profile_id = profile.json()["id"]
        session = api.client.post("/api/v1/sessions", json={}, headers=api.headers(alice))
        assert session.status_code == 201, session.text
        outsiders = {
            role: api.headers(api.user(f"b-{role}", "speech", role))
            for role in ("admin", "member", "viewer")
        }
        b_member = outsiders["member"]
        b_trial = submit(api, b_member["Authorization"].split()[1]).json()["trials"][0]["id"]
        outsiders["trial"] = start_attempt(api, b_trial)
        ids = {
            "experiment_id": experiment["id"],
            "trial_id": trial_id,
            "checkpoint_id": checkpoint_id,
            "token_id": token_id,
            "name": "vision",
            "tenant": "vision",
            "username": "alice",
            "node": "node-a",
            "action": "drain",
            "model": "a-model",
            "version": 1,
            "profile_id": profile_id,
            "rank": 0,
            "index": 0,
            "key": "0123456789abcdef",  # an environment's hash prefix (admins remove them)
            "uuid": "0123456789abcdef0123456789abcdef",  # a sharded checkpoint's set
            "session_id": session.json()["id"],
        }
        yield World(api, ids, outsiders)
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def _samples(uuid: str) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "source": "digits",
        "num_classes": 10,
        "ids": [0, 1],
        "epochs": [0, 0],
        "labels": [0, 1],
        "predictions": [0, 2],
        "margins": [1.5, -0.5],
        "probs": [0.8, 0.2],
        "losses": [0.22, 1.6],
    }


_DATASET = b"a dataset archive of tenant A"
_SHA = hashlib.sha256(_DATASET).hexdigest()
# what each route is sent besides its path: keyword arguments of TestClient.request
_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("PUT", "/api/v1/datasets/{name}/archive"): {
        "params": {"sha256": _SHA, "tenant": "vision"},
        "content": b"planted",
    },
    ("POST", "/api/v1/datasets/{name}/versions"): {"json": {"sha256": _SHA, "tenant": "vision"}},
    ("POST", "/api/v1/trials/{trial_id}/samples"): {"json": _samples("planted-samples")},
    ("POST", "/api/v1/experiments"): {"data": {"spec": SPEC, "tenant": "vision"}},
    ("POST", "/api/v1/trials/{trial_id}/metrics"): {
        "json": {"points": [{"step": 2, "values": {"loss": 0.1}}]}
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints"): {
        "params": {"uuid": "planted", "step": 999},
        "content": b"evil",
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints/direct"): {
        "json": {"uuid": "planted", "step": 999, "size_bytes": 4}
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints/direct/complete"): {
        "json": {"uuid": "planted", "step": 999, "size_bytes": 4, "upload_id": "planted"}
    },
    ("PUT", "/api/v1/trials/{trial_id}/checkpoints/sets/{uuid}/members/{name}"): {
        "params": {"step": 999},
        "content": b"evil",
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints/sets/{uuid}/members/{name}/direct"): {
        "json": {"step": 999, "size_bytes": 4}
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints/sets/{uuid}/members/{name}/direct/complete"): {
        "json": {"step": 999, "size_bytes": 4, "upload_id": "planted"}
    },
    ("POST", "/api/v1/trials/{trial_id}/checkpoints/sets/{uuid}/ranks/{rank}"): {
        "json": {"world_size": 1, "step": 999, "members": []}
    },
    ("POST", "/api/v1/trials/{trial_id}/startup"): {
        "json": {"attempt": 1, "marks": {"first_step_at": 1.0}}
    },
    ("PATCH", "/api/v1/trials/{trial_id}"): {"json": {"priority": "low"}},
    ("PATCH", "/api/v1/tenants/{name}"): {"json": {"weight": 5.0}},
    ("PUT", "/api/v1/users/{username}/memberships"): {
        "json": {"tenant": "vision", "role": "viewer"}
    },
    ("POST", "/api/v1/tokens"): {"json": {"username": "alice"}},
    ("POST", "/api/v1/users"): {"json": {"username": "intruder", "is_admin": True}},
    ("POST", "/api/v1/tenants"): {"json": {"name": "annex"}},
    ("POST", "/api/v1/templates"): {"data": {"name": "planted", "spec": SPEC, "tenant": "vision"}},
    ("GET", "/api/v1/nodes/{node}/series"): {"params": {"metric": "cpu_pct"}},
    ("PATCH", "/api/v1/experiments/{experiment_id}/search"): {"json": {"max_trials": 64}},
    ("POST", "/api/v1/experiments/{experiment_id}/clone"): {"json": {"set": {"lr": 0.5}}},
    ("POST", "/api/v1/trials/{trial_id}/clone"): {"json": {"set": {"lr": 0.5}}},
    ("POST", "/api/v1/trials/{trial_id}/profiles"): {"json": {"steps": 5}},
    ("POST", "/api/v1/trials/{trial_id}/profiles/{profile_id}/ranks/{rank}"): {
        "json": {"top_ops": [{"name": "planted", "calls": 1}]}
    },
    ("PUT", "/api/v1/trials/{trial_id}/profiles/{profile_id}/ranks/{rank}/trace"): {
        "content": b"planted"
    },
    ("POST", "/api/v1/experiments/{experiment_id}/template"): {"json": {"name": "stolen"}},
    ("POST", "/api/v1/templates/{name}/submit"): {"json": {"tenant": "vision"}},
    # tenant A's trial is the first one: registering it into a model is refused to outsiders
    ("POST", "/api/v1/models"): {"json": {"trial_id": 1, "name": "stolen"}},
    ("POST", "/api/v1/sessions"): {"json": {"tenant": "vision"}},
    ("PUT", "/api/v1/tenants/{tenant}/session-limits"): {"json": {"max_gpus": 64}},
}
# routes without an object of tenant A in their path: what they answer must not show A
_LISTINGS = {
    ("GET", "/api/v1/experiments"),
    ("GET", "/api/v1/queue"),
    ("GET", "/api/v1/tenants"),
    ("GET", "/api/v1/tokens"),
    ("GET", "/api/v1/me"),
    ("GET", "/api/v1/cluster"),
    ("GET", "/api/v1/usage"),
    ("GET", "/api/v1/users"),
    ("GET", "/api/v1/templates"),
    ("GET", "/api/v1/nodes"),  # trial ids on GPUs: only of the caller's tenants
    # a node is the cluster's, not a tenant's: anyone reads its health, nothing of tenant A
    ("GET", "/api/v1/nodes/{node}/health"),
    ("GET", "/api/v1/nodes/{node}/series"),
    ("GET", "/api/v1/models"),  # models of the caller's tenants and those shared with them
    ("GET", "/api/v1/datasets"),  # datasets of the caller's tenants and those shared with them
    ("GET", "/api/v1/environments"),  # environments of the caller's tenants' experiments
    ("GET", "/api/v1/sessions"),  # sessions of the caller's tenants
}
# creating routes: refused to non-admins; to a tenant admin of B they touch only B
_CREATING = {
    ("POST", "/api/v1/tokens"),  # for alice: admins only
    ("POST", "/api/v1/users"),
    ("POST", "/api/v1/tenants"),
    ("POST", "/api/v1/experiments"),  # into tenant A
    ("POST", "/api/v1/templates"),  # into tenant A
    ("POST", "/api/v1/models"),  # from tenant A's trial
    ("POST", "/api/v1/sessions"),  # into tenant A
}


def _routes(api: Api) -> list[tuple[str, str]]:
    """Every (method, path template) of the API, from its OpenAPI schema."""
    paths = api.client.get("/api/v1/openapi.json").json()["paths"]
    routes = [(m.upper(), path) for path, operations in paths.items() for m in operations]
    assert len(routes) >= 25
    return sorted(routes)


def test_the_walk_covers_every_route(world: World) -> None:
    walked = {r for r in _routes(world.api) if "{" in r[1]} | _LISTINGS | _CREATING
    assert set(_routes(world.api)) == walked


@pytest.mark.parametrize("who", ["admin", "member", "viewer", "trial"])
def test_another_tenants_tokens_reach_nothing_of_tenant_a(world: World, who: str) -> None:
    api = world.api
    headers = world.outsiders[who]
    seen = []
    for method, template in _routes(api):
        path = template.format(**world.ids)
        kwargs = _BODIES.get((method, template), {})
        r = api.client.request(method, path, headers=headers, **kwargs)
        seen.append((method, template, r.status_code))
        if (method, template) in _LISTINGS:
            assert r.status_code in (200, 403), (who, method, template, r.text)
            text = r.text
            assert "vision" not in text, (who, method, template, text[:300])
            assert "alice" not in text, (who, method, template, text[:300])
        else:
            assert r.status_code in (403, 404), (who, method, template, r.status_code, r.text)
    # tenant A is as it was
    alice_view = api.client.get(
        f"/api/v1/trials/{world.ids['trial_id']}", headers=api.headers()
    ).json()
    assert alice_view["state"] == "RUNNING"
    assert alice_view["priority"] == "normal"
    assert [c["uuid"] for c in alice_view["checkpoints"]] == ["a-ckpt"]
    assert alice_view["latest_metrics"] == {"loss": 1.0, "layers/fc/nonfinite": 1.0, "step": 1}
    assert [(a["kind"], a["layer"]) for a in alice_view["alerts"]] == [("nonfinite", "fc")]
    model = api.client.get("/api/v1/models/a-model", headers=api.headers()).json()
    assert model["shared_with"] == []
    assert [v["version"] for v in model["versions"]] == [1]
    tenants = api.client.get("/api/v1/tenants", headers=api.headers()).json()["data"]
    assert {t["name"] for t in tenants} == {"default", "vision", "speech"}
    assert len(seen) == len(_routes(api))
