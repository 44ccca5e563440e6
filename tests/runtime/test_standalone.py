"""A script run with plain ``python`` (no control plane): local files, same API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import trainhub
from trainhub.runtime.model import BaseCommStrategy, unwrap_model
from trainhub.runtime.protocol import ENV_DISTRIBUTED


def _lines(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_report_prints_json_lines_and_appends_them_to_the_metrics_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ctx = trainhub.init()
    ctx.report(step=1, train_loss=torch.tensor(0.5), val_accuracy=np.float32(0.75))
    ctx.report(step=2, train_loss=0.25, val_accuracy=1)
    ctx.close()

    expected = [
        {"step": 1, "train_loss": 0.5, "val_accuracy": 0.75},
        {"step": 2, "train_loss": 0.25, "val_accuracy": 1.0},
    ]
    assert _lines(tmp_path / "trainhub-metrics.jsonl") == expected
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == expected


def test_metrics_file_path_given_to_init_is_appended_to(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "metrics.jsonl"
    target.parent.mkdir()
    target.write_text('{"step": 0, "loss": 1.0}\n')
    with trainhub.init(metrics_file=target) as ctx:
        ctx.report(step=1, loss=0.5)
    assert _lines(target) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": 1, "loss": "low"}, "metric 'loss' must be a number"),
        ({"step": 1, "loss": torch.ones(3)}, "must be a single number"),
        ({"step": 1.5, "loss": 1.0}, "step must be an int"),
        ({"step": -1, "loss": 1.0}, "step must be >= 0"),
        ({"step": 1}, "at least one metric"),
    ],
)
def test_report_explains_wrong_values(kwargs: dict[str, object], message: str) -> None:
    ctx = trainhub.init()
    with pytest.raises((TypeError, ValueError), match=message):
        ctx.report(**kwargs)  # type: ignore[arg-type]


def test_checkpoint_then_restore_gives_back_the_latest_state(tmp_path: Path) -> None:
    ctx = trainhub.init()
    assert ctx.restore() is None
    for step in (2, 10, 9):
        handle = ctx.save_checkpoint({"w": torch.full((2,), float(step)), "step": step}, step=step)
        assert handle is not None
        assert handle.done
        assert handle.path == tmp_path / "checkpoints" / f"step-{step}.pt"

    state = ctx.restore()

    assert state is not None
    assert state["step"] == 10  # by step number, not by name or time
    assert torch.equal(state["w"], torch.full((2,), 10.0))


def test_restore_reads_the_checkpoint_dir_given_to_init(tmp_path: Path) -> None:
    torch.save({"epoch": 4}, tmp_path / "step-4.pt")
    ctx = trainhub.init(checkpoint_dir=tmp_path)
    assert ctx.restore() == {"epoch": 4}


def test_should_stop_is_false_without_a_control_plane() -> None:
    ctx = trainhub.init()
    assert ctx.should_stop() is False
    assert ctx.stop_reason is None


def test_hparams_default_to_init_arguments_overridden_by_the_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINHUB_HPARAMS", '{"lr": 0.5, "extra": true}')
    ctx = trainhub.init(hparams={"lr": 0.1, "epochs": 3})
    assert ctx.hparams == {"lr": 0.5, "epochs": 3, "extra": True}


def test_bad_launch_environment_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINHUB_HPARAMS", "[1, 2]")
    with pytest.raises(ValueError, match="TRAINHUB_HPARAMS must be a JSON object"):
        trainhub.init()


def test_single_process_context_describes_one_chief_rank_on_cpu() -> None:
    ctx = trainhub.init()
    assert isinstance(ctx, trainhub.Context)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.is_chief) == (0, 0, 1, True)
    assert ctx.device == torch.device("cpu")
    assert (ctx.trial_id, ctx.attempt, ctx.managed) == (None, 1, False)
    assert trainhub.init() is ctx  # one runtime per process until closed
    ctx.close()
    assert trainhub.init() is not ctx


def test_prepare_model_and_loader_leave_one_rank_unwrapped() -> None:
    ctx = trainhub.init()
    model = ctx.prepare_model(nn.Linear(2, 1))
    assert isinstance(model, nn.Linear)
    assert unwrap_model(model) is model
    dataset = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = ctx.prepare_data_loader(dataset, batch_size=4, shuffle=False)
    ctx.set_epoch(loader, 1)
    assert [batch[0].tolist() for batch in loader][:2] == [
        [0.0, 1.0, 2.0, 3.0],
        [4.0, 5.0, 6.0, 7.0],
    ]


def test_unknown_communication_strategy_is_refused_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_DISTRIBUTED, json.dumps({"strategy": "ring"}))
    with trainhub.init() as ctx, pytest.raises(ValueError, match=r"distributed\.strategy: must"):
        ctx.prepare_model(nn.Linear(2, 2))


class _CountingStrategy(BaseCommStrategy):
    name = "counting"
    wraps_single_process = True  # so that one process exercises it

    def __init__(self) -> None:
        self.steps = 0

    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer.register_step_post_hook(lambda *_: setattr(self, "steps", self.steps + 1))
        return optimizer


def test_a_strategy_of_the_script_keeps_the_prepared_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_DISTRIBUTED, json.dumps({"memory": {"precision": "bf16"}}))
    strategy = _CountingStrategy()
    with trainhub.init() as ctx:
        model = ctx.prepare_model(nn.Linear(4, 2), strategy=strategy)
        assert ctx.prepared is not None
        assert ctx.prepared.strategy is strategy
        optimizer = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        with ctx.autocast():
            out = model(torch.randn(3, 4))
        assert out.dtype == torch.bfloat16  # autocast acted
        ctx.backward(out.float().sum())
        ctx.step(optimizer)
    assert strategy.steps == 1


def test_prepare_optimizer_applies_the_large_batch_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    section = {
        "large_batch": {
            "optimizer": "lars",
            "lr_scaling": "linear",
            "reference_batch_size": 16,
            "accumulation_steps": 2,
            "warmup_steps": 4,
        }
    }
    monkeypatch.setenv(ENV_DISTRIBUTED, json.dumps(section))
    from trainhub.runtime.distributed.optim import LARS

    with trainhub.init() as ctx:
        model = ctx.prepare_model(nn.Linear(4, 2))
        ctx.prepare_data_loader(torch.utils.data.TensorDataset(torch.zeros(64, 4)), batch_size=32)
        optimizer = ctx.prepare_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, weight_decay=1e-4)
        )
        assert isinstance(optimizer, LARS)
        group = optimizer.param_groups[0]
        assert (group["momentum"], group["weight_decay"]) == (0.8, 1e-4)
        assert group["lr"] == pytest.approx(0.1 * 32 * 2 / 16)  # global batch 64 / 16 = 4x
        seen: list[float] = []
        optimizer.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
        for _ in range(6):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
        # linear ramp from the base lr (0.1) to the scaled one (0.4) over 4 steps, then 0.4
        assert seen == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
        assert group["lr"] == pytest.approx(0.4)  # the user's schedule sees the scaled lr


def test_linear_scaling_without_a_batch_size_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_DISTRIBUTED, json.dumps({"large_batch": {"lr_scaling": "linear"}}))
    with trainhub.init() as ctx:
        model = ctx.prepare_model(nn.Linear(4, 2))
        with pytest.raises(ValueError, match="per_rank_batch_size"):
            ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_importing_trainhub_or_the_protocol_does_not_import_torch() -> None:
    code = (
        "import sys, trainhub, trainhub.runtime.protocol; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
