"""Layer-health alerts: rules over the ``layers/<layer>/<statistic>`` metrics of one step.

The runtime's ``ctx.watch`` reports, every N training steps, per layer: ``grad_norm``,
``weight_norm``, ``update_ratio``, ``act_mean``, ``act_std``, ``dead_fraction`` or
``saturated_fraction``, and ``nonfinite`` (1: NaN/Inf first seen in that layer's output on the
forward pass; 2: in the gradient reaching it on the backward pass). :func:`evaluate` turns one
reported point into alerts; the control plane keeps the first and last step of each (trial,
kind, layer).

The rules and their thresholds (:class:`AlertThresholds`):

- ``nonfinite``: any ``nonfinite`` marker; names the first layer, in forward order, whose
  output was NaN/Inf, else the first, in backward order, whose incoming gradient was. After
  the first sighting every layer is soon NaN: :func:`attribute_nonfinite` keeps naming the
  layer of the first sighting.
- ``exploding_gradients``: a layer's ``grad_norm`` above ``exploding_grad_norm`` (1e3), or its
  ``update_ratio`` above ``exploding_update_ratio`` (1.0: one step changed the weights by more
  than their own size). Healthy training sits near grad norms of 1e-3..10 and update ratios
  near 1e-3.
- ``vanishing_gradients``: a layer's ``grad_norm`` below ``vanishing_grad_norm`` (1e-7), or
  below ``vanishing_ratio`` (1e-5) times the largest ``grad_norm`` of the same step (the signal
  dies on its way back through depth). Not at step 0, where zero-initialised layers
  legitimately get no gradient yet.
- ``dead_layer``: ``dead_fraction`` (ReLU units zero for the whole batch) or
  ``saturated_fraction`` (tanh/sigmoid outputs in their flat tails) at or above
  ``dead_fraction`` (0.9). Not at step 0.

Pure: plain values in, frozen values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeGuard

PREFIX = "layers/"
NONFINITE_IN_ACTIVATIONS = 1.0
NONFINITE_IN_GRADIENTS = 2.0


class AlertKind(StrEnum):
    NONFINITE = "nonfinite"
    EXPLODING_GRADIENTS = "exploding_gradients"
    VANISHING_GRADIENTS = "vanishing_gradients"
    DEAD_LAYER = "dead_layer"


@dataclass(frozen=True, slots=True)
class AlertThresholds:
    exploding_grad_norm: float = 1e3
    exploding_update_ratio: float = 1.0
    vanishing_grad_norm: float = 1e-7
    vanishing_ratio: float = 1e-5
    dead_fraction: float = 0.9

    def __post_init__(self) -> None:
        for name in ("exploding_grad_norm", "exploding_update_ratio", "vanishing_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if not 0 < self.dead_fraction <= 1:
            raise ValueError("dead_fraction must be in (0, 1]")


DEFAULT_THRESHOLDS = AlertThresholds()


@dataclass(frozen=True, slots=True)
class LayerAlert:
    """One rule that fired at one step for one layer."""

    kind: AlertKind
    layer: str
    step: int
    value: float | None  # the statistic that fired (None for nonfinite)
    message: str


def layer_series(values: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """``{"layers/fc1/grad_norm": 0.3}`` -> ``{"fc1": {"grad_norm": 0.3}}``; other metrics
    are left out."""
    out: dict[str, dict[str, float]] = {}
    for name, value in values.items():
        if not name.startswith(PREFIX):
            continue
        layer, sep, stat = name[len(PREFIX) :].rpartition("/")
        if sep and layer and stat:
            out.setdefault(layer, {})[stat] = value
    return out


def evaluate(
    step: int, values: Mapping[str, float], thresholds: AlertThresholds = DEFAULT_THRESHOLDS
) -> list[LayerAlert]:
    """The alerts one reported point raises (none when it holds no ``layers/`` metrics)."""
    layers = layer_series(values)
    if not layers:
        return []
    alerts: list[LayerAlert] = []
    grads = [s["grad_norm"] for s in layers.values() if _finite(s.get("grad_norm"))]
    largest = max(grads, default=0.0)
    for layer, stats in layers.items():
        marker = stats.get("nonfinite")
        if marker is not None:
            where = (
                "the gradient reaching it (backward pass)"
                if marker == NONFINITE_IN_GRADIENTS
                else "its output (forward pass)"
            )
            alerts.append(
                LayerAlert(
                    AlertKind.NONFINITE,
                    layer,
                    step,
                    None,
                    f"NaN/Inf first appeared in {where} of layer {layer} at step {step}",
                )
            )
        alerts.extend(_gradient_alerts(step, layer, stats, largest, thresholds))
        if step > 0:
            alerts.extend(_dead_alerts(step, layer, stats, thresholds))
    return alerts


def attribute_nonfinite(alerts: list[LayerAlert], first_layer: str | None) -> list[LayerAlert]:
    """Once NaN/Inf has appeared, the optimizer spreads it to every layer and later samples
    see it everywhere: keep naming the layer where it appeared first (``first_layer``, already
    recorded, else the one of the earliest step here); later sightings extend that alert."""
    nonfinite = [a for a in alerts if a.kind is AlertKind.NONFINITE]
    if not nonfinite:
        return alerts
    if first_layer is None:
        first_layer = min(nonfinite, key=lambda a: a.step).layer
    return [
        a
        if a.kind is not AlertKind.NONFINITE or a.layer == first_layer
        else LayerAlert(a.kind, first_layer, a.step, a.value, a.message)
        for a in alerts
    ]


def _gradient_alerts(
    step: int, layer: str, stats: Mapping[str, float], largest: float, t: AlertThresholds
) -> list[LayerAlert]:
    grad = stats.get("grad_norm")
    ratio = stats.get("update_ratio")
    if _finite(grad) and grad > t.exploding_grad_norm:
        return [
            LayerAlert(
                AlertKind.EXPLODING_GRADIENTS,
                layer,
                step,
                grad,
                f"gradient norm {grad:.3g} of layer {layer} at step {step} is above "
                f"{t.exploding_grad_norm:g}",
            )
        ]
    if _finite(ratio) and ratio > t.exploding_update_ratio:
        return [
            LayerAlert(
                AlertKind.EXPLODING_GRADIENTS,
                layer,
                step,
                ratio,
                f"one step changed layer {layer}'s weights by {ratio:.3g}x their norm at step "
                f"{step} (above {t.exploding_update_ratio:g}); lower the learning rate",
            )
        ]
    if step == 0 or not _finite(grad):
        return []
    if grad < t.vanishing_grad_norm:
        why = f"is below {t.vanishing_grad_norm:g}"
    elif largest > 0 and grad < t.vanishing_ratio * largest:
        why = f"is {grad / largest:.1e} of the largest layer's ({largest:.3g})"
    else:
        return []
    return [
        LayerAlert(
            AlertKind.VANISHING_GRADIENTS,
            layer,
            step,
            grad,
            f"gradient norm {grad:.3g} of layer {layer} at step {step} {why}",
        )
    ]


def _dead_alerts(
    step: int, layer: str, stats: Mapping[str, float], t: AlertThresholds
) -> list[LayerAlert]:
    for stat, what in (
        ("dead_fraction", "of its ReLU units are zero for the whole batch"),
        ("saturated_fraction", "of its outputs are saturated"),
    ):
        value = stats.get(stat)
        if _finite(value) and value >= t.dead_fraction:
            return [
                LayerAlert(
                    AlertKind.DEAD_LAYER,
                    layer,
                    step,
                    value,
                    f"layer {layer} at step {step}: {value:.0%} {what}",
                )
            ]
    return []


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)
