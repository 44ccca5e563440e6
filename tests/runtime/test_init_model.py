"""ctx.init_model: warm start by name and shape, reset, freeze, and the errors a user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from trainhub import models
from trainhub.runtime import protocol
from trainhub.runtime.init_model import ModelPlan, extract_state_dict, initialize, load_weights


def _pretrained(num_classes: int = 10) -> nn.Module:
    torch.manual_seed(1)
    return models.create("lenet5", num_classes=num_classes)


def _save(model: nn.Module, path: Path, *, ddp: bool = False) -> Path:
    state = model.state_dict()
    if ddp:
        state = {f"module.{k}": v for k, v in state.items()}
    torch.save({"model": state, "optimizer": {}, "epoch": 3}, path)
    return path


def test_warm_start_loads_matching_tensors_resets_the_head_and_freezes_features(
    tmp_path: Path,
) -> None:
    source = _pretrained(num_classes=10)
    path = _save(source, tmp_path / "ckpt.pt", ddp=True)
    torch.manual_seed(2)
    target = models.create("lenet5", num_classes=5)  # another head: 5 classes
    fresh_head = target.classifier[5].weight.detach().clone()
    plan = ModelPlan(init_from=str(path), freeze=("features.*",), reset=("classifier.5.*",))
    model, report = initialize(target, plan, weights=load_weights(path, torch.device("cpu")))
    assert model is target
    for name, tensor in source.state_dict().items():
        if not name.startswith("classifier.5"):
            assert torch.equal(model.state_dict()[name], tensor), name
    assert model.classifier[5].weight.shape == (5, 84)
    assert not torch.equal(model.classifier[5].weight, fresh_head)  # re-initialised
    assert set(report.reset) == {"classifier.5.weight", "classifier.5.bias"}
    assert set(report.frozen) == {
        n for n, _ in model.named_parameters() if n.startswith("features")
    }
    assert all(not p.requires_grad for n, p in model.named_parameters() if n.startswith("features"))
    assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith("classifier"))
    assert len(report.matched) == 8
    assert report.missing == ()
    assert report.unexpected == ()
    assert "matched 8" in str(report)
    # frozen parameters stay fixed through a training step; the rest moves
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 1, 28, 28)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    optimizer.step()
    for name, parameter in model.named_parameters():
        moved = not torch.equal(parameter, before[name])
        assert moved == name.startswith("classifier"), name


def test_a_shape_mismatch_outside_reset_names_every_tensor(tmp_path: Path) -> None:
    path = _save(_pretrained(num_classes=10), tmp_path / "ckpt.pt")
    target = models.create("lenet5", num_classes=5)
    with pytest.raises(ValueError, match=r"not in model\.reset") as caught:
        initialize(
            target, ModelPlan(init_from=str(path)), weights=load_weights(path, torch.device("cpu"))
        )
    message = str(caught.value)
    assert "classifier.5.weight: weights (10, 84) vs model (5, 84)" in message
    assert "classifier.5.bias: weights (10,) vs model (5,)" in message
    assert "'classifier.5.*'" in message  # the fix, ready to paste


def test_patterns_that_match_nothing_are_refused() -> None:
    model = models.create("mlp", in_features=64, hidden=(16,), num_classes=10)
    with pytest.raises(ValueError, match=r"model.freeze: 'block.\*' matches no parameter"):
        initialize(model, ModelPlan(freeze=("block.*",)), weights=None)


def test_state_dicts_are_found_in_the_usual_places() -> None:
    weights = {"w": torch.zeros(2)}
    assert extract_state_dict(weights) == weights
    assert extract_state_dict({"state_dict": {"_orig_mod.module.w": torch.ones(1)}}).keys() == {"w"}
    with pytest.raises(ValueError, match="no model weights"):
        extract_state_dict({"epoch": 3})


def test_the_plan_comes_from_the_spec_section_in_the_environment() -> None:
    section = {"init_from": "vision/base:2", "freeze": ["a.*"], "reset": [], "grow": None}
    plan = ModelPlan.from_env({protocol.ENV_MODEL: json.dumps(section)})
    assert plan.init_from == "vision/base:2"
    assert plan.freeze == ("a.*",)
    assert ModelPlan.from_env({}) == ModelPlan()


def test_unexpected_and_missing_tensors_are_reported_not_fatal() -> None:
    small = models.create("mlp", in_features=64, hidden=(16,), num_classes=10)
    deep = models.create("mlp", in_features=64, hidden=(16, 16), num_classes=10)
    _, report = initialize(deep, ModelPlan(), weights=small.state_dict())
    assert "blocks.1.linear.weight" in report.missing
    assert report.unexpected == ()
    _, report = initialize(small, ModelPlan(), weights=deep.state_dict())
    assert "blocks.1.linear.weight" in report.unexpected


def test_grow_needs_the_net2net_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "trainhub.models.net2net", None)  # import fails
    model = models.create("mlp", in_features=64, hidden=(16,), num_classes=10)
    with pytest.raises(RuntimeError, match=r"model\.grow needs trainhub\.models\.net2net"):
        initialize(model, ModelPlan(grow={"wider": {"blocks.0.linear": 2.0}}), weights=None)


def test_loaded_weights_are_grown_keeping_the_function() -> None:
    pytest.importorskip("trainhub.models.net2net", reason="Net2Net lands with the growth work")
    source = _pretrained(num_classes=10).eval()
    plan = ModelPlan(grow={"wider": {"classifier.1": 2.0}, "deeper": ["classifier.1"]})
    grown, report = initialize(
        models.create("lenet5", num_classes=10), plan, weights=source.state_dict()
    )
    assert report.grown == ("wider classifier.1 x2.0", "deeper classifier.1")
    x = torch.randn(8, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(grown.eval()(x), source(x), atol=1e-4, rtol=1e-4)
    assert sum(p.numel() for p in grown.parameters()) > sum(p.numel() for p in source.parameters())


def test_a_layer_grow_cannot_find_is_named_by_its_spec_path() -> None:
    pytest.importorskip("trainhub.models.net2net", reason="Net2Net lands with the growth work")
    model = models.create("mlp", in_features=4, hidden=(3,), num_classes=2)
    for grow, path in (
        ({"wider": {"nolayer": 2.0}}, r"model\.grow\.wider\.nolayer: .*no layer named 'nolayer'"),
        ({"deeper": ["blocks.0.linear", "head"]}, r"model\.grow\.deeper\.1: "),
    ):
        with pytest.raises(ValueError, match=path):
            initialize(model, ModelPlan(grow=grow), weights=None)
