"""Population-based training as pure decisions (exploit and explore).

Each tick the search service hands :func:`decide` the live members of a population (their latest
score, step and checkpoint) and a seeded random generator; it returns one decision per member that
is due (reached its next perturbation step):

- :class:`Exploit`: the member is in the bottom ``quantile``; it is replaced by a new trial that
  restarts from a top-``quantile`` member's latest checkpoint with perturbed hyperparameters
  (:func:`explore`). The replaced trial ends PRUNED.
- :class:`Continue`: it keeps training; its next decision is ``interval`` steps later.

Nothing here reads a clock or a database; the tests drive it with plain values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainhub.core.search_space import (
    CategoricalParam,
    Distribution,
    FloatParam,
    IntParam,
    Scalar,
    SearchSpace,
)


@dataclass(frozen=True)
class Member:
    trial_id: int
    hparams: Mapping[str, Any]
    score: float | None  # latest value of the searcher's metric; None before the first report
    step: int  # latest step the metric was reported at
    checkpoint_id: int | None  # its latest checkpoint (a donor needs one)
    due_step: int  # the step at which its next decision is due


@dataclass(frozen=True)
class PbtConfig:
    mode: str  # "max" or "min"
    quantile: float
    interval: int
    resample_probability: float
    factors: tuple[float, float]
    mutable: tuple[Distribution, ...]  # what explore may change, with the ranges to keep within


@dataclass(frozen=True)
class Exploit:
    trial_id: int  # the member replaced
    donor_id: int
    checkpoint_id: int  # the donor's checkpoint the new trial restores
    hparams: dict[str, Any]  # the donor's, perturbed
    reason: str


@dataclass(frozen=True)
class Continue:
    trial_id: int
    due_step: int


Decision = Exploit | Continue


class RandomSuggest:
    """Samples a distribution with a seeded generator (the first population, resampling)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def suggest_float(self, param: FloatParam) -> float:
        if param.step is not None:
            values = param.grid()
            assert values is not None
            return self.rng.choice(values)
        if param.log:
            return math.exp(self.rng.uniform(math.log(param.low), math.log(param.high)))
        return self.rng.uniform(param.low, param.high)

    def suggest_int(self, param: IntParam) -> int:
        if param.log:
            value = round(math.exp(self.rng.uniform(math.log(param.low), math.log(param.high))))
            return min(max(value, param.low), param.high)
        return self.rng.choice(param.grid())

    def suggest_categorical(self, param: CategoricalParam) -> Scalar:
        return self.rng.choice(param.values)


def quantile_size(population: int, quantile: float) -> int:
    """Members in the top (and in the bottom) quantile: at least 1, at most half."""
    return max(1, min(math.ceil(population * quantile), population // 2))


def decide(members: Sequence[Member], config: PbtConfig, rng: random.Random) -> list[Decision]:
    """Exploit or continue, for every member whose decision is due."""
    due = [m for m in members if m.score is not None and m.step >= m.due_step]
    scored = [m for m in members if m.score is not None]
    if not due or len(scored) < 2:
        return []
    sign = -1.0 if config.mode == "max" else 1.0
    ranked = sorted(scored, key=lambda m: (sign * float(m.score or 0.0), m.trial_id))
    size = quantile_size(len(ranked), config.quantile)
    top, bottom = ranked[:size], {m.trial_id for m in ranked[-size:]}
    donors = [m for m in top if m.checkpoint_id is not None]
    decisions: list[Decision] = []
    for member in sorted(due, key=lambda m: m.trial_id):
        if member.trial_id in bottom and donors:
            donor = rng.choice(donors)
            assert donor.checkpoint_id is not None
            decisions.append(
                Exploit(
                    trial_id=member.trial_id,
                    donor_id=donor.trial_id,
                    checkpoint_id=donor.checkpoint_id,
                    hparams=explore(donor.hparams, config, rng),
                    reason=f"pbt: score {member.score:.4g} at step {member.step} in the bottom "
                    f"{size} of {len(ranked)}; replaced by a copy of trial {donor.trial_id} "
                    f"(score {donor.score:.4g})",
                )
            )
        else:
            decisions.append(Continue(member.trial_id, member.step + config.interval))
    return decisions


def explore(hparams: Mapping[str, Any], config: PbtConfig, rng: random.Random) -> dict[str, Any]:
    """The donor's hyperparameters, each mutable one resampled or perturbed."""
    out = dict(hparams)
    suggest = RandomSuggest(rng)
    for param in config.mutable:
        if param.name not in out:
            continue
        if isinstance(param, CategoricalParam):
            if any(c.params for c in param.choices):
                continue  # a new choice would need its own nested values: keep the donor's
            values = param.values
            if rng.random() < config.resample_probability or out[param.name] not in values:
                out[param.name] = suggest.suggest_categorical(param)
            else:
                index = values.index(out[param.name]) + rng.choice((-1, 1))
                out[param.name] = values[min(max(index, 0), len(values) - 1)]
            continue
        if rng.random() < config.resample_probability:
            out[param.name] = SearchSpace((param,)).sample(suggest)[param.name]
            continue
        value = float(out[param.name]) * rng.choice(config.factors)
        value = min(max(value, param.low), param.high)
        out[param.name] = round(value) if isinstance(param, IntParam) else value
    return out
