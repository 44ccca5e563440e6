"""Candidates for ``trainhub models suggest``: the zoo built for a problem, and registered
versions described by what they recorded. Ranking is pure (``trainhub.core.model_fit``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from trainhub.core.model_fit import IMAGE_CLASSIFICATION, Candidate, Fit, Problem, rank_models
from trainhub.models import available, count_parameters, create

IMAGE = IMAGE_CLASSIFICATION
# the inputs each zoo architecture was designed and tuned for
DESIGNED_FOR: dict[str, tuple[tuple[int, ...], ...]] = {
    "lenet5": ((1, 28, 28), (1, 32, 32)),
    "resnet20": ((3, 32, 32),),
    "resnet18": ((3, 224, 224), (3, 32, 32)),
}


def zoo_args(name: str, shape: tuple[int, ...], num_classes: int) -> dict[str, Any] | None:
    """Arguments that build zoo model ``name`` for inputs of ``shape``; None if it cannot."""
    channels = shape[0]
    if name == "mlp":
        return {"in_features": math.prod(shape), "num_classes": num_classes}
    if len(shape) != 3:
        return None
    height, width = shape[1], shape[2]
    if name == "lenet5":
        if height != width or height not in (28, 32):
            return None
        return {"in_channels": channels, "num_classes": num_classes, "image_size": height}
    if name == "resnet20":
        return {"in_channels": channels, "num_classes": num_classes} if height >= 8 else None
    if name == "resnet18":
        if height < 8:
            return None
        return {"in_channels": channels, "num_classes": num_classes, "small_input": height <= 64}
    if name == "transformer":
        return {
            "num_classes": num_classes,
            "input_dim": width * (channels if channels > 1 else 1),
            "max_length": max(height, 8),
        }
    return None


def zoo_candidates(problem: Problem) -> list[Candidate]:
    if problem.task != IMAGE:
        return []
    found = []
    for name in available():
        args = zoo_args(name, problem.input_shape, problem.num_classes)
        if args is None:
            continue
        found.append(
            Candidate(
                ref=f"zoo:{name}",
                source="zoo",
                task=IMAGE,
                input_shape=problem.input_shape,
                num_classes=problem.num_classes,
                num_parameters=count_parameters(create(name, **args)),
                adapts_to_input=True,
                designed_for=DESIGNED_FOR.get(name, ()),
            )
        )
    return found


def _parameters(arch: Mapping[str, Any]) -> int | None:
    try:
        return count_parameters(create(str(arch["zoo"]), **dict(arch.get("args") or {})))
    except Exception:  # an arch this installation cannot build: unknown size
        return None


def _versions(model: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A model's versions, newest first (a listing without them: its latest)."""
    versions = model.get("versions") or ([model["latest"]] if model.get("latest") else [])
    return sorted(versions, key=lambda v: int(v.get("version") or 0), reverse=True)


def loads(version: Mapping[str, Any]) -> bool:
    """Whether a version's weights may be offered: not known to miss its architecture (the
    registry checks them at registration, and re-checks older versions after it starts)."""
    return version.get("weights_fit") is not False


def ranked_version(model: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The version of ``model`` suggest ranks: its latest whose weights load."""
    return next((v for v in _versions(model) if loads(v)), None)


def left_out(models: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(ref, why) of each model's newer versions that suggest does not rank because their
    weights do not load into their architecture."""
    out = []
    for model in models:
        for version in _versions(model):
            if loads(version):
                break
            out.append((str(version["ref"]), str(version.get("weights_problem") or "")))
    return out


def registry_candidates(models: Iterable[Mapping[str, Any]]) -> list[Candidate]:
    """The latest version whose weights load of each model of a ``GET /api/v1/models``
    listing (a version whose weights do not load into its architecture is never offered)."""
    found = []
    for model in models:
        latest = ranked_version(model)
        if not latest:
            continue
        arch = latest.get("arch") or {}
        metrics = {
            k: float(v)
            for k, v in (latest.get("metrics") or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        args = arch.get("args") or {}
        shape = arch.get("input")
        params = metrics.get("num_parameters")
        found.append(
            Candidate(
                ref=latest["ref"],
                source="registry",
                task=arch.get("task", IMAGE),
                input_shape=tuple(shape) if shape else None,
                num_classes=args.get("num_classes"),
                num_parameters=int(params) if params else (_parameters(arch) if arch else None),
                metrics=metrics,
                adapts_to_input=arch.get("zoo") in ("resnet20", "resnet18"),
                designed_for=DESIGNED_FOR.get(str(arch.get("zoo")), ()),
            )
        )
    return found


def suggest(problem: Problem, registered: Iterable[Mapping[str, Any]] = ()) -> list[Fit]:
    """Registered and zoo models, best fit first."""
    return rank_models([*registry_candidates(registered), *zoo_candidates(problem)], problem)
