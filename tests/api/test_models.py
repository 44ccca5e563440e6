"""The model registry over the API: register from a trial, per-tenant visibility, explicit
sharing (tenant admins), init_from checked and pinned at submit, weights for the trial."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import Served, build_bounded_api
from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api

WEIGHTS = b"pretend-torch-checkpoint-bytes"
ARCH = {"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]}
SPEC_WITH_ARCH = (
    "name: pretrain\nentrypoint: python train.py\n"
    "hyperparameters: {dataset: mnist, lr: 0.01}\ncheckpoints: {keep_latest: 2}\n"
    "model: {arch: {zoo: lenet5, args: {num_classes: 10}, input: [1, 28, 28]}}\n"
)


@dataclass
class World:
    api: Api
    alice: str  # member of vision
    vadmin: str  # admin of vision
    viewer: str  # viewer of vision
    bob: str  # member of speech
    sadmin: str  # admin of speech
    trial_id: int
    trial_headers: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    api = build_bounded_api(Path(tmp_path_factory.mktemp("models")))
    with api.client:
        alice = api.user("alice", "vision")
        vadmin = api.user("vera", "vision", "admin")
        viewer = api.user("vic", "vision", "viewer")
        bob = api.user("bob", "speech")
        sadmin = api.user("sam", "speech", "admin")
        r = submit(api, alice, SPEC_WITH_ARCH)
        assert r.status_code == 201, r.text
        trial_id = r.json()["trials"][0]["id"]
        own = start_attempt(api, trial_id)
        for step, acc in ((1, 0.5), (2, 0.9)):
            r = api.client.post(
                f"/api/v1/trials/{trial_id}/checkpoints",
                params={"uuid": f"c{step}", "step": step, "metrics": f'{{"val_accuracy": {acc}}}'},
                content=WEIGHTS + bytes([step]),
                headers=own,
            )
            assert r.status_code == 201, r.text
        yield World(api, alice, vadmin, viewer, bob, sadmin, trial_id, own)
    api.services.uow.engine.dispose()


def _register(w: World, token: str, name: str = "digits", **extra: object) -> httpx.Response:
    body = {"trial_id": w.trial_id, "name": name, **extra}
    return w.api.client.post("/api/v1/models", json=body, headers=w.api.headers(token))


def test_register_records_weights_arch_metrics_and_lineage(world: World) -> None:
    api = world.api
    r = _register(world, world.alice, "lenet-a")
    assert r.status_code == 201, r.text
    version = r.json()
    assert version["ref"] == "vision/lenet-a:1"
    assert version["arch"] == {**ARCH, "task": "image-classification"}
    assert version["metrics"]["val_accuracy"] == 0.9  # the latest checkpoint's
    assert version["hparams"] == {"dataset": "mnist", "lr": 0.01}
    lineage = version["lineage"]
    assert lineage["trial_id"] == world.trial_id
    assert lineage["checkpoint_step"] == 2
    assert lineage["data"] == "mnist"
    # a chosen checkpoint makes version 2, its own weights
    first = api.client.get(f"/api/v1/trials/{world.trial_id}/checkpoints", headers=api.headers())
    step1 = next(c for c in first.json()["data"] if c["step"] == 1)["id"]
    r2 = _register(world, world.alice, "lenet-a", checkpoint_id=step1)
    assert r2.json()["version"] == 2
    file = api.client.get(
        "/api/v1/models/lenet-a/versions/2/file", headers=api.headers(world.alice)
    )
    assert file.status_code == 200
    assert file.content == WEIGHTS + b"\x01"
    shown = api.client.get("/api/v1/models/lenet-a", headers=api.headers(world.viewer)).json()
    assert [v["version"] for v in shown["versions"]] == [1, 2]
    assert shown["latest"]["version"] == 2


def test_viewers_and_other_tenants_cannot_register(world: World) -> None:
    assert _register(world, world.viewer, "nope").status_code == 403
    assert _register(world, world.bob, "nope").status_code == 404
    bad = _register(world, world.alice, "bad name!")
    assert bad.status_code == 422


def test_other_tenants_see_a_model_only_once_shared_by_a_tenant_admin(world: World) -> None:
    api = world.api
    assert _register(world, world.alice, "shared-m").status_code == 201
    bob = api.headers(world.bob)
    assert api.client.get("/api/v1/models/shared-m", headers=bob).status_code == 404
    assert "shared-m" not in api.client.get("/api/v1/models", headers=bob).text
    assert api.client.get("/api/v1/models/shared-m/versions/1/file", headers=bob).status_code == 404
    # members do not share; other tenants' admins cannot either
    r = api.client.put("/api/v1/models/shared-m/shares/speech", headers=api.headers(world.alice))
    assert r.status_code == 403
    r = api.client.put("/api/v1/models/shared-m/shares/speech", headers=api.headers(world.sadmin))
    assert r.status_code == 404
    r = api.client.put("/api/v1/models/shared-m/shares/speech", headers=api.headers(world.vadmin))
    assert r.status_code == 200, r.text
    assert r.json()["shared_with"] == ["speech"]
    assert api.client.get("/api/v1/models/shared-m", headers=bob).status_code == 200
    file = api.client.get("/api/v1/models/shared-m/versions/1/file", headers=bob)
    assert file.content == WEIGHTS + b"\x02"
    # read-only for the other tenant: it cannot share further or register into it
    r = api.client.put("/api/v1/models/shared-m/shares/default", headers=api.headers(world.sadmin))
    assert r.status_code == 403
    r = api.client.delete(
        "/api/v1/models/shared-m/shares/speech", headers=api.headers(world.vadmin)
    )
    assert r.status_code == 200
    assert api.client.get("/api/v1/models/shared-m", headers=bob).status_code == 404


def test_init_from_is_checked_and_pinned_at_submit(world: World) -> None:
    api = world.api
    assert _register(world, world.alice, "base").status_code == 201
    spec = "name: ft\nentrypoint: python train.py\nmodel: {init_from: base, freeze: [features.*]}\n"
    r = submit(api, world.alice, spec)
    assert r.status_code == 201, r.text
    experiment = api.client.get(
        f"/api/v1/experiments/{r.json()['id']}", headers=api.headers(world.alice)
    ).json()
    assert experiment["spec"]["model"]["init_from"] == "vision/base:1"  # pinned
    # the trial's own token gets exactly those weights
    trial_id = r.json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    weights = api.client.get(f"/api/v1/trials/{trial_id}/init-weights", headers=own)
    assert weights.status_code == 200
    assert weights.content == WEIGHTS + b"\x02"
    # another trial's token does not
    other = api.client.get(f"/api/v1/trials/{trial_id}/init-weights", headers=world.trial_headers)
    assert other.status_code == 404
    # speech cannot start from vision's model, nor from vision's trial; unknown versions fail
    for ref in ("base", "vision/base:1", f"trial:{world.trial_id}"):
        spec = f"name: ft\nentrypoint: python train.py\nmodel: {{init_from: '{ref}'}}\n"
        r = submit(api, world.bob, spec)
        assert r.status_code == 422, (ref, r.text)
        assert r.json()["errors"][0]["path"] == "model.init_from"
    r = submit(
        api, world.alice, "name: ft\nentrypoint: python train.py\nmodel: {init_from: base:9}\n"
    )
    assert r.status_code == 422
    assert "no version 9" in r.text
    r = submit(
        api,
        world.alice,
        f"name: ft\nentrypoint: python train.py\nmodel: {{init_from: 'trial:{world.trial_id}'}}\n",
    )
    assert r.status_code == 201, r.text


def test_an_unknown_zoo_architecture_is_refused_at_submit_and_registration(
    world: World,
) -> None:
    spec = "name: x\nentrypoint: python train.py\nmodel: {arch: {zoo: resnet50}}\n"
    r = submit(world.api, world.alice, spec)
    assert r.status_code == 422, r.text
    assert [e["path"] for e in r.json()["errors"]] == ["model.arch.zoo"]
    r = _register(world, world.alice, "odd", arch={"zoo": "nope"})
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert (error["path"], error["message"]) == ("arch.zoo", "unknown zoo model 'nope'")


def test_a_shared_model_starts_another_tenants_training(world: World) -> None:
    api = world.api
    assert _register(world, world.alice, "gift").status_code == 201
    api.client.put("/api/v1/models/gift/shares/speech", headers=api.headers(world.vadmin))
    spec = "name: ft\nentrypoint: python train.py\nmodel: {init_from: gift}\n"
    r = submit(api, world.bob, spec)
    assert r.status_code == 201, r.text
    trial_id = r.json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    assert api.client.get(f"/api/v1/trials/{trial_id}/init-weights", headers=own).status_code == 200
    # unsharing takes effect for the next download
    api.client.delete("/api/v1/models/gift/shares/speech", headers=api.headers(world.vadmin))
    assert api.client.get(f"/api/v1/trials/{trial_id}/init-weights", headers=own).status_code == 404


def test_admins_see_every_model(world: World) -> None:
    _register(world, world.alice, "admin-visible")
    names = {
        m["name"]
        for m in world.api.client.get("/api/v1/models", headers=world.api.headers()).json()["data"]
    }
    assert "admin-visible" in names


def test_the_runtime_loads_init_from_weights_through_the_control_plane(
    served: Served, tmp_path: Path
) -> None:
    import io

    import torch

    from trainhub import models
    from trainhub.runtime.init_model import ModelPlan, init_model

    api = served.api
    alice = api.user("alice", "vision")
    r = submit(api, alice, SPEC_WITH_ARCH)
    source_trial = r.json()["trials"][0]["id"]
    own = start_attempt(api, source_trial)
    torch.manual_seed(3)
    source = models.create("mlp", in_features=64, hidden=(8,), num_classes=10)
    buffer = io.BytesIO()
    torch.save({"model": source.state_dict()}, buffer)
    r = api.client.post(
        f"/api/v1/trials/{source_trial}/checkpoints",
        params={"uuid": "real", "step": 1},
        content=buffer.getvalue(),
        headers=own,
    )
    assert r.status_code == 201, r.text
    assert api.client.post(
        "/api/v1/models",
        json={"trial_id": source_trial, "name": "mlp-base"},
        headers=api.headers(alice),
    ).is_success
    spec = "name: ft\nentrypoint: python train.py\nmodel: {init_from: mlp-base, reset: [head.*]}\n"
    trial_id = submit(api, alice, spec).json()["trials"][0]["id"]
    token = start_attempt(api, trial_id)["Authorization"].split()[1]
    target = models.create("mlp", in_features=64, hidden=(8,), num_classes=3)
    plan = ModelPlan(init_from="vision/mlp-base:1", reset=("head.*",))
    model, report = init_model(
        target,
        plan,
        device=torch.device("cpu"),
        api_url=served.url,
        token=token,
        trial_id=trial_id,
        spool=tmp_path,
    )
    assert torch.equal(model.blocks[0].linear.weight, source.blocks[0].linear.weight)
    assert set(report.reset) == {"head.weight", "head.bias"}
    # a token of another trial is refused with the server's reason
    with pytest.raises(RuntimeError, match="404"):
        init_model(
            models.create("mlp", in_features=64, hidden=(8,), num_classes=3),
            plan,
            device=torch.device("cpu"),
            api_url=served.url,
            token=own["Authorization"].split()[1],
            trial_id=trial_id,
            spool=tmp_path / "other",
        )


def test_registered_weights_count_against_the_tenant_storage_quota(world: World) -> None:
    api = world.api
    r = api.client.patch(
        "/api/v1/tenants/vision", json={"max_storage_bytes": 200}, headers=api.headers()
    )
    assert r.status_code == 200, r.text
    try:
        refused = _register(world, world.alice, "too-many")
        assert refused.status_code == 413, refused.text
        assert "registered models count with checkpoints" in refused.json()["message"]
    finally:
        api.client.patch(
            "/api/v1/tenants/vision",
            json={"max_storage_bytes": 1024**4},
            headers=api.headers(),
        )
    assert _register(world, world.alice, "fits-again").status_code == 201
