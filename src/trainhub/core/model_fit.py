"""How well a model fits a problem: the ranking behind ``trainhub models suggest``.

Pure: candidates are plain values (a zoo model built for the problem, or a registered version
with its recorded architecture, shape and metrics); :func:`rank_models` scores each and says
why in words. The rules, in order of weight:

1. the task must match (others are left out);
2. the input: the same shape fits as is; the same channels with another size needs an
   architecture that adapts (global pooling) or a resize; other channels need the first
   layer reset;
3. the classes: the same count keeps the head; another count needs ``reset`` of the head;
   an architecture designed for this input (the zoo's LeNet-5 for 28x28 digits, ResNet-20 for
   32x32 colour images) gets half a point;
4. a trained model (a registered version with a recorded accuracy) beats an untrained one, by
   its accuracy: transfer needs a good start;
5. among equals, fewer parameters first (cheaper to fine-tune and serve).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# metric names read as "accuracy" (higher is better, in [0, 1] or in percent)
ACCURACY_METRICS = ("val_accuracy", "accuracy", "val_acc", "acc", "top1")


IMAGE_CLASSIFICATION = "image-classification"


@dataclass(frozen=True)
class Problem:
    task: str
    input_shape: tuple[int, ...]
    num_classes: int

    def __post_init__(self) -> None:
        if self.task == IMAGE_CLASSIFICATION and len(self.input_shape) != 3:
            shape = "x".join(str(d) for d in self.input_shape)
            raise ValueError(
                f"--input {shape}: an image is CxHxW (channels, height, width), "
                "e.g. 1x28x28 for MNIST or 3x32x32 for CIFAR"
            )


@dataclass(frozen=True)
class Candidate:
    """A model that might start a training: ``ref`` is what ``init_from`` (or a script's
    ``models.create``) takes."""

    ref: str
    source: str  # "zoo" | "registry"
    task: str
    input_shape: tuple[int, ...] | None
    num_classes: int | None
    num_parameters: int | None
    metrics: Mapping[str, float] = field(default_factory=dict)
    # the zoo can rebuild this model for any input size (global pooling, flatten of any size)
    adapts_to_input: bool = False
    # inputs the architecture was designed and tuned for (LeNet-5: 1x28x28, ResNet-20: 3x32x32)
    designed_for: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Fit:
    candidate: Candidate
    score: float
    reasons: tuple[str, ...]
    accuracy: float | None


def recorded_accuracy(metrics: Mapping[str, float]) -> float | None:
    """The first accuracy-like metric, as a fraction in [0, 1]."""
    for name in ACCURACY_METRICS:
        value = metrics.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value) / 100.0 if value > 1.0 else float(value)
    return None


def score_model(candidate: Candidate, problem: Problem) -> Fit | None:
    """The fit of one candidate, or None when its task differs."""
    if candidate.task != problem.task:
        return None
    score = 0.0
    reasons: list[str] = []
    shape = candidate.input_shape
    if shape is None:
        reasons.append("input shape not recorded")
    elif tuple(shape) == problem.input_shape:
        score += 3.0
        reasons.append("same input shape")
    elif shape[:1] == problem.input_shape[:1]:
        if candidate.adapts_to_input:
            score += 2.0
            reasons.append("same channels; adapts to the input size")
        else:
            score += 1.0
            reasons.append(f"input {'x'.join(map(str, shape))}: resize the data")
    else:
        reasons.append("other channels: reset the first layer")
    if problem.input_shape in candidate.designed_for:
        score += 0.5
        reasons.append("designed for this input")
    if candidate.num_classes == problem.num_classes:
        score += 2.0
        reasons.append("same classes")
    elif candidate.num_classes is not None:
        score += 0.5
        reasons.append(f"{candidate.num_classes} classes: reset the head")
    accuracy = recorded_accuracy(candidate.metrics)
    if accuracy is not None:
        score += 1.0 + 2.0 * accuracy
        reasons.append(f"trained, accuracy {accuracy:.1%}")
    else:
        reasons.append("untrained" if candidate.source == "zoo" else "no accuracy recorded")
    if candidate.num_parameters:
        # a tie-breaker: 10x more parameters costs a tenth of a point
        score -= 0.1 * math.log10(max(candidate.num_parameters, 1))
    return Fit(candidate, round(score, 4), tuple(reasons), accuracy)


def rank_models(candidates: Iterable[Candidate], problem: Problem) -> list[Fit]:
    """Every candidate of the problem's task, best fit first (ties: fewer parameters, ref)."""
    fits = [f for f in (score_model(c, problem) for c in candidates) if f is not None]
    return sorted(
        fits,
        key=lambda f: (-f.score, f.candidate.num_parameters or 0, f.candidate.ref),
    )


def parse_shape(text: str) -> tuple[int, ...]:
    """``1x28x28`` (or ``1,28,28``) -> (1, 28, 28).

    Raises:
        ValueError: not 1-4 positive integers.
    """
    parts = text.replace(",", "x").lower().split("x")
    if not 1 <= len(parts) <= 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a shape; write it as CxHxW, e.g. 1x28x28")
    shape = tuple(int(p) for p in parts)
    if any(d < 1 or d > 1_000_000 for d in shape):
        raise ValueError(f"{text!r}: every dimension is 1..1000000")
    return shape
