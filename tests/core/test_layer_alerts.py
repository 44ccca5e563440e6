"""Layer-health rules on plain values."""

from __future__ import annotations

import pytest

from trainhub.core.layer_alerts import (
    AlertKind,
    AlertThresholds,
    attribute_nonfinite,
    evaluate,
    layer_series,
)


def healthy(layer: str, grad: float = 0.5) -> dict[str, float]:
    return {
        f"layers/{layer}/grad_norm": grad,
        f"layers/{layer}/weight_norm": 3.0,
        f"layers/{layer}/update_ratio": 1e-3,
        f"layers/{layer}/act_mean": 0.1,
        f"layers/{layer}/act_std": 0.9,
    }


def kinds(alerts: list) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(str(a.kind), a.layer) for a in alerts}


def test_healthy_layers_and_other_metrics_raise_nothing() -> None:
    values = {
        **healthy("fc1"),
        **healthy("fc2", 0.05),
        "loss": 0.3,
        "layers/relu/dead_fraction": 0.4,
    }
    assert evaluate(10, values) == []
    assert evaluate(10, {"loss": 1e9}) == []


def test_series_are_split_by_the_last_slash() -> None:
    assert layer_series({"layers/a.b/c/grad_norm": 1.0, "loss": 2.0}) == {
        "a.b/c": {"grad_norm": 1.0}
    }


def test_exploding_by_gradient_norm_or_by_update_ratio() -> None:
    values = {**healthy("fc1", 5e3), **healthy("fc2"), "layers/fc2/update_ratio": 3.0}
    alerts = evaluate(7, values)
    assert kinds(alerts) == {("exploding_gradients", "fc1"), ("exploding_gradients", "fc2")}
    first = next(a for a in alerts if a.layer == "fc1")
    assert first.step == 7
    assert first.value == 5e3
    assert "fc1" in first.message
    assert "step 7" in first.message


def test_vanishing_absolute_and_relative_to_the_largest_layer() -> None:
    values = {**healthy("in", 1e-9), **healthy("mid", 1e-6), **healthy("out", 1.0)}
    assert kinds(evaluate(5, values)) == {
        ("vanishing_gradients", "in"),
        ("vanishing_gradients", "mid"),
    }
    # step 0 is initialisation: zero-initialised layers get no gradient yet
    assert evaluate(0, values) == []


def test_dead_and_saturated_layers() -> None:
    values = {"layers/r/dead_fraction": 0.95, "layers/t/saturated_fraction": 0.9}
    assert kinds(evaluate(3, values)) == {("dead_layer", "r"), ("dead_layer", "t")}
    assert evaluate(3, {"layers/r/dead_fraction": 0.89}) == []


def test_nonfinite_names_the_layer_and_the_pass() -> None:
    [forward] = evaluate(4, {"layers/features.3/nonfinite": 1.0})
    assert forward.kind is AlertKind.NONFINITE
    assert forward.layer == "features.3"
    assert "forward" in forward.message
    [backward] = evaluate(0, {"layers/fc/nonfinite": 2.0})
    assert "backward" in backward.message


def test_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="dead_fraction"):
        AlertThresholds(dead_fraction=1.5)
    strict = AlertThresholds(exploding_grad_norm=0.1)
    assert kinds(evaluate(1, healthy("fc"), strict)) == {("exploding_gradients", "fc")}


def test_later_nan_sightings_keep_naming_the_first_layer() -> None:
    first = evaluate(20, {"layers/fc2/nonfinite": 1.0})
    later = evaluate(25, {"layers/fc0/nonfinite": 1.0, "layers/fc1/grad_norm": 1e9})
    assert [a.layer for a in attribute_nonfinite(first + later, None)] == ["fc2", "fc2", "fc1"]
    [again] = attribute_nonfinite(evaluate(30, {"layers/fc0/nonfinite": 1.0}), "fc2")
    assert (again.layer, again.step) == ("fc2", 30)
