"""Search spaces: the ``hyperparameters`` section of a spec when some values are distributions.

A value in ``hyperparameters`` is a constant (a number, string, boolean, list) or a distribution::

    lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
    layers: {type: int, low: 1, high: 4}              # step defaults to 1
    dropout: {type: float, low: 0.0, high: 0.5, step: 0.1}
    optimizer:
      type: categorical
      choices:
        - sgd                                         # a plain choice
        - value: adam                                 # a choice with its own parameters
          params: {beta1: {type: float, low: 0.8, high: 0.999}}

Parameters nested under a choice exist only in trials that picked that choice (a conditional
space); every parameter name is unique across the whole space, because the script reads all of
them flat from ``ctx.hparams``. :func:`parse_space` checks a space and reports every problem with
its field path. :meth:`SearchSpace.sample` walks the space in a fixed order and asks a
:class:`Suggest` for each value: the Optuna adapter answers with an Optuna trial (define-by-run),
PBT's explore step with a seeded random generator. This module is pure: no Optuna here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trainhub.core.errors import FieldError, InvalidSpec

Scalar = str | int | float | bool | None
_DISTRIBUTION_TYPES = ("float", "int", "categorical")


@dataclass(frozen=True)
class FloatParam:
    name: str
    low: float
    high: float
    log: bool = False
    step: float | None = None  # a finite grid: low, low + step, ... <= high

    def grid(self) -> tuple[float, ...] | None:
        if self.step is None:
            return None
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        return tuple(round(self.low + i * self.step, 12) for i in range(count))


@dataclass(frozen=True)
class IntParam:
    name: str
    low: int
    high: int
    log: bool = False
    step: int = 1

    def grid(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))


@dataclass(frozen=True)
class Choice:
    value: Scalar
    params: tuple[Param, ...] = ()  # exist only when this choice was picked


@dataclass(frozen=True)
class CategoricalParam:
    name: str
    choices: tuple[Choice, ...]

    @property
    def values(self) -> tuple[Scalar, ...]:
        return tuple(c.value for c in self.choices)

    def grid(self) -> tuple[Scalar, ...]:
        return self.values


@dataclass(frozen=True)
class Constant:
    name: str
    value: Any


Param = FloatParam | IntParam | CategoricalParam | Constant
Distribution = FloatParam | IntParam | CategoricalParam


class Suggest(Protocol):
    """Picks one value per distribution (an Optuna trial, or a seeded generator)."""

    def suggest_float(self, param: FloatParam) -> float: ...
    def suggest_int(self, param: IntParam) -> int: ...
    def suggest_categorical(self, param: CategoricalParam) -> Scalar: ...


@dataclass(frozen=True)
class SearchSpace:
    """The parsed hyperparameters: top-level params in spec order, conditionals nested."""

    params: tuple[Param, ...]

    def walk(self) -> Iterator[Param]:
        """Every parameter, nested ones included, depth first in spec order."""
        stack = list(reversed(self.params))
        while stack:
            param = stack.pop()
            yield param
            if isinstance(param, CategoricalParam):
                for choice in reversed(param.choices):
                    stack.extend(reversed(choice.params))

    @property
    def distributions(self) -> tuple[Distribution, ...]:
        return tuple(p for p in self.walk() if not isinstance(p, Constant))

    @property
    def is_constant(self) -> bool:
        return not self.distributions

    @property
    def is_conditional(self) -> bool:
        return any(
            c.params for p in self.params if isinstance(p, CategoricalParam) for c in p.choices
        )

    def by_name(self) -> dict[str, Param]:
        return {p.name: p for p in self.walk()}

    def grid(self) -> dict[str, tuple[Scalar, ...]] | None:
        """Values of each distribution for a grid search; None if some float has no step."""
        grid: dict[str, tuple[Scalar, ...]] = {}
        for param in self.distributions:
            values = param.grid()
            if values is None:
                return None
            grid[param.name] = values
        return grid

    def grid_size(self) -> int | None:
        grid = self.grid()
        return None if grid is None else math.prod(len(v) for v in grid.values())

    def sample(self, suggest: Suggest) -> dict[str, Any]:
        """One point of the space: constants as they are, each active distribution suggested."""
        values: dict[str, Any] = {}
        self._sample_into(self.params, suggest, values)
        return values

    def _sample_into(
        self, params: tuple[Param, ...], suggest: Suggest, values: dict[str, Any]
    ) -> None:
        for param in params:
            if isinstance(param, Constant):
                values[param.name] = param.value
            elif isinstance(param, FloatParam):
                values[param.name] = suggest.suggest_float(param)
            elif isinstance(param, IntParam):
                values[param.name] = suggest.suggest_int(param)
            else:
                picked = suggest.suggest_categorical(param)
                values[param.name] = picked
                for choice in param.choices:
                    if choice.value == picked and type(choice.value) is type(picked):
                        self._sample_into(choice.params, suggest, values)

    def constants(self) -> dict[str, Any]:
        """The values of a space without distributions (what the 'single' searcher runs)."""
        return {p.name: p.value for p in self.params if isinstance(p, Constant)}


def is_distribution(value: Any) -> bool:
    return isinstance(value, Mapping) and "type" in value


def parse_space(raw: Mapping[str, Any], path: str = "hyperparameters") -> SearchSpace:
    """Parse and check a hyperparameters mapping; raise InvalidSpec listing every problem."""
    errors: list[FieldError] = []
    params = _parse_params(raw, path, errors)
    seen: dict[str, str] = {}
    for param, where in _walk_with_paths(params, path):
        if param.name in seen:
            errors.append(
                FieldError(
                    where,
                    f"the name {param.name!r} is also defined at {seen[param.name]}",
                    "give every hyperparameter a unique name: the script reads them all flat "
                    "from ctx.hparams",
                )
            )
        else:
            seen[param.name] = where
    if errors:
        raise InvalidSpec(errors)
    return SearchSpace(params)


def _walk_with_paths(params: tuple[Param, ...], path: str) -> Iterator[tuple[Param, str]]:
    for param in params:
        where = f"{path}.{param.name}"
        yield param, where
        if isinstance(param, CategoricalParam):
            for index, choice in enumerate(param.choices):
                yield from _walk_with_paths(choice.params, f"{where}.choices.{index}.params")


def _parse_params(raw: Mapping[str, Any], path: str, errors: list[FieldError]) -> tuple[Param, ...]:
    params: list[Param] = []
    for name, value in raw.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            errors.append(
                FieldError(where, f"name {name!r} must be a Python identifier", "e.g. lr, n_layers")
            )
            continue
        if is_distribution(value):
            param = _parse_distribution(name, value, where, errors)
            if param is not None:
                params.append(param)
        elif isinstance(value, Mapping):
            errors.append(
                FieldError(
                    where,
                    "a mapping must be a distribution with a 'type'",
                    "use {type: float|int|categorical, ...} or a constant (number, string, "
                    "boolean, list)",
                )
            )
        else:
            params.append(Constant(name, value))
    return tuple(params)


_KEYS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}


def _parse_distribution(
    name: str, raw: Mapping[str, Any], path: str, errors: list[FieldError]
) -> Param | None:
    kind = raw.get("type")
    if kind not in _DISTRIBUTION_TYPES:
        errors.append(
            FieldError(
                f"{path}.type",
                f"{kind!r} is not a distribution type",
                "use float, int or categorical; a log scale is {type: float, low: ..., high: "
                "..., log: true}",
            )
        )
        return None
    unknown = sorted(set(raw) - _KEYS[kind])
    if unknown:
        errors.append(
            FieldError(
                f"{path}.{unknown[0]}",
                f"unknown field {unknown[0]!r} for a {kind} distribution",
                "known fields here: " + ", ".join(sorted(_KEYS[kind])),
            )
        )
        return None
    if kind == "categorical":
        return _parse_categorical(name, raw, path, errors)
    return _parse_numeric(name, kind, raw, path, errors)


def _number(raw: Mapping[str, Any], key: str, path: str, integer: bool) -> float | int | str:
    """The number at ``key``, or an error message."""
    if key not in raw:
        return "this field is required"
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {value!r}"
    if not math.isfinite(value):
        return "must be finite"
    if integer and not float(value).is_integer():
        return f"must be an integer for an int distribution, got {value!r}"
    return int(value) if integer else float(value)


def _parse_numeric(
    name: str, kind: str, raw: Mapping[str, Any], path: str, errors: list[FieldError]
) -> Param | None:
    integer = kind == "int"
    low = _number(raw, "low", path, integer)
    high = _number(raw, "high", path, integer)
    bad = False
    for key, got in (("low", low), ("high", high)):
        if isinstance(got, str):
            errors.append(FieldError(f"{path}.{key}", got))
            bad = True
    log = raw.get("log", False)
    if not isinstance(log, bool):
        errors.append(FieldError(f"{path}.log", f"must be true or false, got {log!r}"))
        bad = True
    step: float | int | str | None = None
    if raw.get("step") is not None:
        step = _number(raw, "step", path, integer)
        if isinstance(step, str):
            errors.append(FieldError(f"{path}.step", step))
            bad = True
        elif step <= 0:
            errors.append(FieldError(f"{path}.step", f"must be > 0, got {step}"))
            bad = True
    if bad:
        return None
    assert not isinstance(low, str)
    assert not isinstance(high, str)
    assert not isinstance(step, str)
    if low >= high:
        errors.append(
            FieldError(
                f"{path}.low",
                f"low ({low}) must be below high ({high})",
                "for a fixed value write the constant itself, e.g. " + f"{name}: {low}",
            )
        )
        return None
    if log and low <= 0:
        errors.append(
            FieldError(
                f"{path}.low",
                f"a log-scale range needs low > 0, got {low}",
                "raise low above 0 or drop log: true",
            )
        )
        return None
    if log and step is not None and (not integer or step != 1):
        errors.append(
            FieldError(
                f"{path}.step",
                "log and step cannot be combined",
                "drop step, or drop log: true",
            )
        )
        return None
    if integer:
        return IntParam(name, int(low), int(high), log, int(step or 1))
    return FloatParam(name, float(low), float(high), log, None if step is None else float(step))


def _parse_categorical(
    name: str, raw: Mapping[str, Any], path: str, errors: list[FieldError]
) -> Param | None:
    choices_raw = raw.get("choices")
    where = f"{path}.choices"
    if not isinstance(choices_raw, list) or not choices_raw:
        errors.append(
            FieldError(where, "needs a non-empty list of choices", "e.g. choices: [sgd, adam]")
        )
        return None
    choices: list[Choice] = []
    for index, item in enumerate(choices_raw):
        at = f"{where}.{index}"
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - {"value", "params"})
            if "value" not in item or unknown:
                errors.append(
                    FieldError(
                        at,
                        "a choice with nested parameters is {value: ..., params: {...}}",
                        f"unknown field {unknown[0]!r}" if unknown else "add 'value'",
                    )
                )
                continue
            value = item["value"]
            nested = item.get("params") or {}
            if not isinstance(nested, Mapping):
                errors.append(FieldError(f"{at}.params", "must be a mapping of hyperparameters"))
                continue
            params = _parse_params(nested, f"{at}.params", errors)
            value_at = f"{at}.value"
        else:
            value, params, value_at = item, (), at
        if not isinstance(value, str | int | float | bool) and value is not None:
            errors.append(
                FieldError(
                    value_at,
                    f"a choice must be a string, number, boolean or null, got {value!r}",
                    "name the choice and read its details in the script",
                )
            )
            continue
        if any(c.value == value and type(c.value) is type(value) for c in choices):
            errors.append(FieldError(value_at, f"the choice {value!r} is listed twice"))
            continue
        choices.append(Choice(value, params))
    if len(choices) != len(choices_raw):
        return None
    return CategoricalParam(name, tuple(choices))
