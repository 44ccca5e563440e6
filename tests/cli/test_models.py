"""`trainhub models ...` and `trainhub compress` against a live server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.cli.conftest import Cli, LiveServer
from trainhub import models

pytest.importorskip("onnxruntime")

SPEC = (
    "name: pretrain\nentrypoint: python train.py\n"
    "model: {arch: {zoo: lenet5, args: {num_classes: 10}, input: [1, 28, 28]}}\n"
)


def test_register_list_show_download_export_suggest_and_compress(
    live: LiveServer, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = live.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice, SPEC).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    torch.manual_seed(0)
    net = models.create("lenet5", num_classes=10)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "epoch": 1}, buffer)
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": "c1", "step": 1, "metrics": '{"val_accuracy": 0.97}'},
        content=buffer.getvalue(),
        headers=own,
    )
    assert r.status_code == 201, r.text

    result = cli("models", "register", str(trial_id), "--name", "digits", token=alice)
    assert result.exit_code == 0, result.output
    assert "registered vision/digits:1" in result.output
    listed = cli("models", "ls", token=alice)
    assert "digits" in listed.output
    assert "val_accuracy=0.97" in listed.output
    shown = cli("models", "show", "digits:1", token=alice)
    assert json.loads(shown.output)["arch"]["zoo"] == "lenet5"

    monkeypatch.chdir(tmp_path)
    assert cli("models", "download", "digits", token=alice).exit_code == 0
    state = torch.load(tmp_path / "digits-v1.pt", weights_only=True)
    assert torch.equal(state["model"]["classifier.5.bias"], net.classifier[5].bias)
    exported = cli("models", "export", "digits", "--format", "onnx", token=alice)
    assert exported.exit_code == 0, exported.output
    assert "checked against PyTorch" in exported.output
    assert (tmp_path / "digits-v1.onnx").stat().st_size > 200_000

    suggested = cli("models", "suggest", "--input", "1x28x28", "--classes", "10", token=alice)
    assert suggested.exit_code == 0, suggested.output
    first = next(line for line in suggested.output.splitlines() if line.strip().startswith("│ 1"))
    assert "vision/digits:1" in first

    compressed = cli("compress", "digits", "--prune", "0.5", "--no-wait", token=alice)
    assert compressed.exit_code == 0, compressed.output
    experiments = api.client.get("/api/v1/experiments", headers=api.headers(alice)).json()
    job = next(e for e in experiments["data"] if e["name"] == "compress-digits")
    spec = api.client.get(f"/api/v1/experiments/{job['id']}", headers=api.headers(alice)).json()
    assert spec["spec"]["model"]["init_from"] == "vision/digits:1"
    assert spec["spec"]["entrypoint"].startswith("python -m trainhub.jobs.compress --arch")

    bad = cli("models", "show", "nope:x", token=alice)
    assert bad.exit_code == 2
    assert "a version is a positive integer" in bad.output


def _checkpoint(live: LiveServer, trial_id: int, own: dict[str, str], state: dict) -> None:
    buffer = io.BytesIO()
    torch.save({"model": state, "epoch": 1}, buffer)
    r = live.api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": f"c{trial_id}", "step": 1, "metrics": '{"val_accuracy": 0.9}'},
        content=buffer.getvalue(),
        headers=own,
    )
    assert r.status_code == 201, r.text


def test_register_refuses_weights_that_do_not_fit_the_declared_architecture(
    live: LiveServer, cli: Cli
) -> None:
    api = live.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice, SPEC).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)

    class Other(torch.nn.Module):  # a LeNet written by hand: other tensor names
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 6, 5)
            self.fc3 = torch.nn.Linear(84, 10)

    _checkpoint(live, trial_id, own, Other().state_dict())
    refused = cli("models", "register", str(trial_id), "--name", "digits", token=alice)
    assert refused.exit_code == 2, refused.output
    assert "does not load into lenet5" in refused.output
    assert "missing features.0.weight" in refused.output
    assert "unexpected conv1.weight" in refused.output
    assert "model.arch" in refused.output  # where the architecture was declared
    assert "digits" not in cli("models", "ls", token=alice).output  # nothing was kept
    # --arch naming an architecture of another shape: refused at --arch, with the shapes
    wrong = cli(
        "models", "register", str(trial_id), "--name", "digits",
        "--arch", '{"zoo": "lenet5", "args": {"num_classes": 3}}', token=alice,
    )  # fmt: skip
    assert wrong.exit_code == 2
    assert "--arch" in wrong.output


def test_delete_a_version_refused_while_a_trial_starts_from_it(live: LiveServer, cli: Cli) -> None:
    api = live.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice, SPEC).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    _checkpoint(live, trial_id, own, models.create("lenet5", num_classes=10).state_dict())
    for _ in range(2):
        assert cli("models", "register", str(trial_id), "-n", "digits", token=alice).exit_code == 0
    user = submit(api, alice, SPEC.replace("model: {", "model: {init_from: 'digits:2', "))
    assert user.status_code == 201, user.text
    user_trial = user.json()["trials"][0]["id"]
    refused = cli("models", "delete", "digits:2", token=alice)
    assert refused.exit_code == 2, refused.output
    assert f"trial {user_trial}" in refused.output
    assert "in use" in refused.output
    assert cli("models", "delete", "digits", token=alice).exit_code == 2  # which version?
    deleted = cli("models", "delete", "digits:1", token=alice)
    assert deleted.exit_code == 0, deleted.output
    assert "deleted vision/digits:1" in deleted.output
    assert cli("models", "show", "digits:1", token=alice).exit_code == 2
    cli("cancel", "--trial", str(user_trial), token=alice)
    assert cli("models", "delete", "digits:2", token=alice).exit_code == 0
    # a number is never given twice: the next version is 3
    again = cli("models", "register", str(trial_id), "-n", "digits", token=alice)
    assert "registered vision/digits:3" in again.output
    bob = api.user("bob", "default")
    assert cli("models", "delete", "vision/digits:3", token=bob).exit_code == 2  # not his


def test_a_version_registered_before_the_check_is_rechecked_and_never_suggested(
    live: LiveServer, cli: Cli
) -> None:
    """A version kept before registration checked weights: the server's re-check marks it,
    `models show` says why, and suggest ranks the version before it instead."""
    from trainhub.service.registry import NewVersion

    api = live.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice, SPEC).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    _checkpoint(live, trial_id, own, models.create("lenet5", num_classes=10).state_dict())
    registered = cli("models", "register", str(trial_id), "--name", "digits", token=alice)
    assert registered.exit_code == 0, registered.output
    registry = api.services.models
    assert registry is not None
    # version 2 as an older server kept it: a hand-written LeNet's tensors, never checked
    buffer = io.BytesIO()
    torch.save({"model": {"conv1.weight": torch.zeros(6, 1, 5, 5)}}, buffer)
    key = "tenants/vision/models/digits/old.ckpt"
    writer = registry.store.open_writer(key)
    writer.write(buffer.getvalue())
    size = writer.commit()
    arch = {"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]}
    old = NewVersion(arch, {"val_accuracy": 0.99}, {}, {"trial_id": trial_id})
    registry.models.add_version("vision", "digits", "", key, size, old, "alice", 1.0)
    listed = api.client.get("/api/v1/models/digits", headers=api.headers(alice)).json()
    assert [v["weights_fit"] for v in listed["versions"]] == [True, None]

    from trainhub.server import recheck_weights

    recheck_weights(api.services)  # what the server runs, aside, after it starts
    assert registry.recheck_weights() == {"fit": 0, "misfit": 0}  # each version once
    shown = cli("models", "show", "digits:2", token=alice)
    version = json.loads(shown.output)
    assert version["weights_fit"] is False
    assert "missing features.0.weight" in version["weights_problem"]
    assert "unexpected conv1.weight" in version["weights_problem"]
    table = cli("models", "show", "digits", token=alice).output
    assert "weights do not load" in table
    assert "version 2: its weights do not load into lenet5" in table
    suggested = cli("models", "suggest", "--input", "1x28x28", "--classes", "10", token=alice)
    assert suggested.exit_code == 0, suggested.output
    assert "vision/digits:1" in suggested.output
    rows = [line for line in suggested.output.splitlines() if line.startswith("│")]
    assert any("vision/digits:1" in row for row in rows)
    assert not any("digits:2" in row for row in rows)
    assert "left out: vision/digits:2: its weights do not load" in suggested.output
