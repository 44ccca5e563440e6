"""Wrong input to the model, debug and clone commands: a one-line message and exit code != 0,
never a traceback (the Cli fixture fails on one)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.cli.conftest import Cli, LiveServer
from trainhub import models

SPEC = (
    "name: pretrain\nentrypoint: python train.py\n"
    "model: {arch: {zoo: mlp, args: {in_features: 64, hidden: [8], num_classes: 10}, "
    "input: [1, 8, 8]}}\n"
)


@pytest.fixture
def registered(live: LiveServer, cli: Cli) -> tuple[str, int]:
    """A user's token and a trial of theirs registered as model ``small:1``."""
    api = live.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice, SPEC).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    net = models.create("mlp", in_features=64, hidden=(8,), num_classes=10)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict()}, buffer)
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": "c1", "step": 1},
        content=buffer.getvalue(),
        headers=own,
    )
    assert r.status_code == 201, r.text
    result = cli("models", "register", str(trial_id), "--name", "small", token=alice)
    assert result.exit_code == 0, result.output
    return alice, trial_id


def test_a_model_reference_is_printed_as_written(cli: Cli) -> None:
    result = cli("models", "show", "a:b:c")
    assert result.exit_code == 2
    assert "'a:b:c'" in result.output  # rich printed ':b:' as an emoji


def test_register_refuses_an_arch_that_is_not_a_json_object(
    cli: Cli, registered: tuple[str, int]
) -> None:
    alice, trial_id = registered
    for arch, said in (("{bad", "--arch is not JSON"), ("[1, 2]", "must be a JSON object")):
        result = cli("models", "register", str(trial_id), "-n", "x", "--arch", arch, token=alice)
        assert result.exit_code == 2, result.output
        assert said in result.output


def test_download_and_export_to_a_directory_or_a_missing_one(
    cli: Cli, registered: tuple[str, int], tmp_path: Path
) -> None:
    alice, _ = registered
    missing = tmp_path / "no" / "such"
    for command in ("download", "export"):
        result = cli("models", command, "small", "-o", str(missing / "x"), token=alice)
        assert result.exit_code == 2, result.output
        assert f"cannot write {missing / 'x'}" in result.output
    assert cli("models", "download", "small", "-o", str(tmp_path), token=alice).exit_code == 0
    assert (tmp_path / "small-v1.pt").is_file()


def test_export_with_an_input_the_model_does_not_take(
    cli: Cli, registered: tuple[str, int]
) -> None:
    alice, _ = registered
    wrong = cli("models", "export", "small", "--input", "1x28x28", token=alice)
    assert wrong.exit_code == 2, wrong.output
    assert "does not take inputs of shape 1x28x28" in wrong.output
    malformed = cli("models", "export", "small", "--input", "abc", token=alice)
    assert malformed.exit_code == 2, malformed.output


def test_a_refused_field_is_printed_once(cli: Cli, registered: tuple[str, int]) -> None:
    alice, trial_id = registered
    result = cli("models", "register", str(trial_id), "--name", "bad name!", token=alice)
    assert result.exit_code == 2
    assert result.output.count("name:") == 1, result.output


def test_suggest_needs_an_image_shape_and_a_task_with_models(cli: Cli) -> None:
    flat = cli("models", "suggest", "--input", "1x28", "--offline")
    assert flat.exit_code == 2, flat.output
    assert "an image is CxHxW" in flat.output
    unknown = cli("models", "suggest", "--task", "speech", "--offline")
    assert unknown.exit_code == 2, unknown.output
    assert "no registered or zoo model is for task 'speech'" in unknown.output


def test_debug_checks_its_options_before_asking_the_server(cli: Cli, tmp_path: Path) -> None:
    score = cli("debug", "1", "--score", "xyz")
    assert score.exit_code == 2, score.output
    assert "--score 'xyz': use one of aum, confidence" in score.output
    missing = tmp_path / "no" / "scores.csv"
    csv = cli("debug", "1", "--csv", str(missing))
    assert csv.exit_code == 2, csv.output
    assert f"cannot write {missing}" in csv.output


def test_compress_refuses_an_unknown_dataset(cli: Cli) -> None:
    result = cli("compress", "small", "--data", "imagenet")
    assert result.exit_code == 2, result.output
    assert "--data 'imagenet': use one of auto," in result.output


def test_every_option_and_argument_of_the_new_commands_has_help() -> None:
    import typer.main

    from trainhub.cli.main import app

    group = typer.main.get_command(app)
    commands = ["debug", "profile", "clone", "compress"]
    undocumented = []
    for name in commands:
        command = group.commands[name]  # type: ignore[attr-defined]
        undocumented += [f"{name} {p.name}" for p in command.params if not getattr(p, "help", "")]
    models = group.commands["models"].commands  # type: ignore[attr-defined]
    for name, command in models.items():
        undocumented += [
            f"models {name} {p.name}" for p in command.params if not getattr(p, "help", "")
        ]
    assert undocumented == []
