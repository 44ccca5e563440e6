"""The ``searcher`` section of a spec: how trials are chosen and stopped.

Three kinds, told apart by ``name`` (or by the fields given):

- ``single`` (the default): one trial with the constant hyperparameters.
- a search (``name: search``, or any ``sampler``/``pruner``): the sampler picks each trial's
  hyperparameters, the pruner stops poor trials early; orthogonal, as in Optuna::

      searcher: {sampler: tpe, pruner: asha, metric: val_accuracy, mode: max, max_trials: 32,
                 max_concurrent_trials: 4, budget: {unit: epochs, min: 1, max: 27}}

  ``name`` may also be a sampler (grid, random, tpe, cmaes, qmc) or a pruner (asha, hyperband,
  median, with random sampling) as a shorthand.
- ``pbt``: population-based training; ``population`` trials train at once, and every
  ``perturbation_interval`` budget units the bottom ``quantile`` restart from a checkpoint of a
  top-``quantile`` trial with perturbed hyperparameters (new trials; the replaced ones end PRUNED).

:func:`searcher_errors` checks the searcher against the search space with field paths.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core import limits
from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.search_space import SearchSpace, parse_space

SAMPLERS = ("grid", "random", "tpe", "cmaes", "qmc")
PRUNERS = ("none", "median", "asha", "hyperband")
SamplerName = Literal["grid", "random", "tpe", "cmaes", "qmc"]
PrunerName = Literal["none", "median", "asha", "hyperband"]
SearcherName = Literal[
    "single",
    "search",
    "pbt",
    "grid",
    "random",
    "tpe",
    "cmaes",
    "qmc",
    "asha",
    "hyperband",
    "median",
]
SearcherKind = Literal["single", "search", "pbt"]
DEFAULT_MAX_TRIALS = 16
DEFAULT_MAX_CONCURRENT_TRIALS = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """How much training a trial may get, counted in the steps it reports its metric at."""

    unit: Literal["epochs", "steps"] = Field(
        "epochs", description="What the step of ctx.report counts (documentation for people)."
    )
    min: Annotated[
        int, Field(ge=1, description="Budget before a trial may be pruned (first rung).")
    ] = 1
    max: Annotated[
        int | None, Field(ge=1, description="Full budget of a trial; asha, hyperband, pbt need it.")
    ] = None


class SearcherSpec(_Strict):
    """How trials are chosen and stopped: single, an Optuna search, or pbt."""

    name: SearcherName | None = Field(
        None, description="single (default), search, pbt, or a sampler/pruner name as shorthand."
    )
    metric: str | None = Field(
        None,
        pattern=limits.METRIC_NAME_PATTERN,
        description="Metric that ranks trials and checkpoints, e.g. val_accuracy.",
    )
    mode: Literal["max", "min"] = "max"
    require_metric: bool | None = Field(
        None,
        description="Fail a trial that does not report the metric (a typo in its name, or a "
        "trial that ends without it) instead of warning; default: true for searches and pbt, "
        "false for a single trial.",
    )
    sampler: SamplerName | None = Field(
        None, description="grid, random, tpe (default), cmaes or qmc (Optuna's samplers)."
    )
    pruner: PrunerName | None = Field(
        None, description="none (default), median, asha (successive halving) or hyperband."
    )
    max_trials: Annotated[
        int | None, Field(ge=1, le=100_000, description="Trials in all (default: 16; grid: size).")
    ] = None
    max_concurrent_trials: Annotated[
        int, Field(ge=1, le=10_000, description="Trials queued or running at once, at most.")
    ] = DEFAULT_MAX_CONCURRENT_TRIALS
    budget: Budget = Field(default_factory=Budget)
    reduction_factor: Annotated[
        int, Field(ge=2, le=100, description="asha/hyperband: keep 1/reduction_factor per rung.")
    ] = 3
    seed: int | None = Field(None, description="Seed of the sampler (reproducible searches).")
    source_checkpoint_id: int | None = Field(
        None,
        description="Warm start: trials without a checkpoint of their own start from this one "
        "(set by trainhub clone --from-checkpoint).",
    )
    # population-based training
    population: Annotated[int, Field(ge=2, le=1000, description="pbt: trials at once.")] = 8
    perturbation_interval: Annotated[
        int, Field(ge=1, description="pbt: budget units between two exploit/explore decisions.")
    ] = 4
    quantile: Annotated[
        float, Field(gt=0, le=0.5, description="pbt: share of the population replaced (bottom).")
    ] = 0.25
    mutations: dict[str, Any] = Field(
        default_factory=dict,
        description="pbt: distributions to resample from, by hyperparameter (default: every "
        "distribution of the space).",
    )
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25
    perturbation_factors: tuple[float, float] = Field(
        (0.8, 1.2), description="pbt: a numeric hyperparameter is multiplied by one of these."
    )

    @property
    def kind(self) -> SearcherKind:
        if self.name == "pbt":
            return "pbt"
        if self.name in (None, "single") and self.sampler is None and self.pruner is None:
            return "single"
        return "search"

    @property
    def requires_metric(self) -> bool:
        """Whether a trial that does not report the metric fails (see ``require_metric``)."""
        if self.require_metric is not None:
            return self.require_metric and self.metric is not None
        return self.kind != "single" and self.metric is not None

    @property
    def sampler_name(self) -> SamplerName:
        if self.sampler is not None:
            return self.sampler
        if self.name in SAMPLERS:
            return self.name  # type: ignore[return-value]
        if self.name in ("asha", "hyperband", "median"):
            return "random"
        return "tpe"

    @property
    def pruner_name(self) -> PrunerName:
        if self.pruner is not None:
            return self.pruner
        if self.name in ("asha", "hyperband", "median"):
            return self.name
        return "none"

    def trial_limit(self, space: SearchSpace) -> int:
        """How many trials the search makes in all."""
        if self.max_trials is not None:
            limit = self.max_trials
        elif self.kind == "pbt":
            limit = self.population * 4
        else:
            limit = DEFAULT_MAX_TRIALS
        if self.kind == "search" and self.sampler_name == "grid":
            size = space.grid_size()
            if size is not None and (self.max_trials is None or size < limit):
                limit = size
        return limit


def searcher_errors(searcher: SearcherSpec, space: SearchSpace) -> list[FieldError]:
    """Problems of a searcher with this space, each at its field path."""
    errors: list[FieldError] = []
    kind = searcher.kind
    if kind == "single":
        for param in space.distributions:
            errors.append(
                FieldError(
                    f"hyperparameters.{param.name}",
                    "is a distribution, but the 'single' searcher runs one trial of constants",
                    "pick a search: e.g. searcher: {sampler: tpe, metric: val_accuracy, "
                    "max_trials: 16}; or write a constant",
                )
            )
        return errors
    if not searcher.metric:
        errors.append(
            FieldError(
                "searcher.metric",
                f"a {kind} searcher needs the metric it optimises",
                "e.g. metric: val_accuracy, mode: max (the name your script passes to ctx.report)",
            )
        )
    if space.is_constant:
        errors.append(
            FieldError(
                "hyperparameters",
                "has no distribution to search over",
                "make a value a distribution, e.g. lr: {type: float, low: 1.0e-4, high: 0.1, "
                "log: true}",
            )
        )
    budget = searcher.budget
    needs_max = kind == "pbt" or searcher.pruner_name in ("asha", "hyperband")
    if needs_max and budget.max is None:
        what = "pbt" if kind == "pbt" else f"pruner {searcher.pruner_name}"
        errors.append(
            FieldError(
                "searcher.budget.max",
                f"{what} needs the full budget of a trial",
                "e.g. budget: {unit: epochs, min: 1, max: 27}",
            )
        )
    if budget.max is not None and budget.min >= budget.max:
        errors.append(
            FieldError(
                "searcher.budget.min",
                f"min ({budget.min}) must be below max ({budget.max})",
                "min is where the first pruning decision happens",
            )
        )
    if kind == "search" and searcher.sampler_name == "grid":
        errors.extend(_grid_errors(space))
    if kind == "pbt":
        errors.extend(_pbt_errors(searcher, space))
    elif searcher.mutations:
        errors.append(
            FieldError("searcher.mutations", "only pbt mutates hyperparameters", "remove it")
        )
    return errors


def _grid_errors(space: SearchSpace) -> list[FieldError]:
    errors: list[FieldError] = []
    if space.is_conditional:
        errors.append(
            FieldError(
                "searcher.sampler",
                "a grid cannot search a conditional space (choices with nested params)",
                "use sampler random or tpe, or flatten the choices",
            )
        )
    for param in space.distributions:
        if param.grid() is None:
            errors.append(
                FieldError(
                    f"hyperparameters.{param.name}",
                    "a grid over a continuous range needs a step",
                    "add step, e.g. {type: float, low: ..., high: ..., step: 0.1}, or use "
                    "sampler random",
                )
            )
    return errors


def _pbt_errors(searcher: SearcherSpec, space: SearchSpace) -> list[FieldError]:
    errors: list[FieldError] = []
    if searcher.sampler is not None or searcher.pruner is not None:
        errors.append(
            FieldError(
                "searcher.sampler" if searcher.sampler else "searcher.pruner",
                "pbt samples its first population at random and replaces trials itself",
                "remove sampler and pruner from a pbt searcher",
            )
        )
    low, high = searcher.perturbation_factors
    if not 0 < low < 1 < high:
        errors.append(
            FieldError(
                "searcher.perturbation_factors",
                f"must be [a, b] with 0 < a < 1 < b, got [{low}, {high}]",
                "e.g. [0.8, 1.2]",
            )
        )
    known = space.by_name()
    try:
        parse_space(searcher.mutations, "searcher.mutations")
    except InvalidSpec as exc:
        errors.extend(exc.errors)
    for name in searcher.mutations:
        if name not in known:
            errors.append(
                FieldError(
                    f"searcher.mutations.{name}",
                    f"{name!r} is not a hyperparameter",
                    "known: " + ", ".join(sorted(known)),
                )
            )
    return errors
