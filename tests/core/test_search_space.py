"""Search spaces, searcher checks and PBT decisions, with plain values."""

from __future__ import annotations

import random
from typing import Any

import pytest

from trainhub.core.errors import InvalidSpec
from trainhub.core.pbt import Continue, Exploit, Member, PbtConfig, RandomSuggest, decide, explore
from trainhub.core.search_space import (
    CategoricalParam,
    Constant,
    FloatParam,
    IntParam,
    parse_space,
)
from trainhub.core.spec import parse_spec

SPACE: dict[str, Any] = {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "layers": {"type": "int", "low": 1, "high": 4},
    "optimizer": {
        "type": "categorical",
        "choices": [
            "sgd",
            {"value": "adam", "params": {"beta1": {"type": "float", "low": 0.8, "high": 0.99}}},
        ],
    },
    "epochs": 5,
}


def _paths(exc: InvalidSpec) -> list[str]:
    return [e.path for e in exc.errors]


def test_parses_distributions_constants_and_conditionals() -> None:
    space = parse_space(SPACE)
    by_name = space.by_name()
    assert by_name["lr"] == FloatParam("lr", 1e-4, 1e-1, log=True)
    assert by_name["layers"] == IntParam("layers", 1, 4)
    assert by_name["epochs"] == Constant("epochs", 5)
    optimizer = by_name["optimizer"]
    assert isinstance(optimizer, CategoricalParam)
    assert optimizer.values == ("sgd", "adam")
    assert "beta1" in by_name  # nested under the adam choice
    assert space.is_conditional
    assert not space.is_constant


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"lr": {"type": "float", "low": 1, "high": 1}}, "hyperparameters.lr.low", "below high"),
        (
            {"lr": {"type": "float", "low": 0, "high": 1, "log": True}},
            "hyperparameters.lr.low",
            "> 0",
        ),
        ({"x": {"type": "categorical", "choices": []}}, "hyperparameters.x.choices", "non-empty"),
        ({"x": {"type": "int", "low": 1.5, "high": 4}}, "hyperparameters.x.low", "integer"),
        ({"x": {"type": "float", "low": 0, "hi": 1}}, "hyperparameters.x.hi", "unknown field"),
        (
            {"x": {"type": "log", "min": 0, "max": 1}},
            "hyperparameters.x.type",
            "not a distribution",
        ),
        (
            {"x": {"type": "float", "low": 0, "high": 1, "step": -1}},
            "hyperparameters.x.step",
            "> 0",
        ),
        ({"x": {"type": "categorical", "choices": [1, 1]}}, "hyperparameters.x.choices.1", "twice"),
        (
            {"x": {"type": "categorical", "choices": [[1, 2]]}},
            "hyperparameters.x.choices.0",
            "string",
        ),
        ({"x": {"a": 1}}, "hyperparameters.x", "distribution with a 'type'"),
        ({"not-a-name": 1}, "hyperparameters.not-a-name", "identifier"),
        (
            {
                "o": {
                    "type": "categorical",
                    "choices": [
                        {"value": "a", "params": {"o": {"type": "int", "low": 0, "high": 2}}}
                    ],
                }
            },
            "hyperparameters.o.choices.0.params.o",
            "also defined",
        ),
    ],
)
def test_bad_spaces_name_the_field(raw: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_space(raw)
    assert path in _paths(info.value)
    assert words in info.value.message


def test_every_problem_is_reported_at_once() -> None:
    raw = {
        "a": {"type": "float", "low": 2, "high": 1},
        "b": {"type": "categorical", "choices": []},
    }
    with pytest.raises(InvalidSpec) as info:
        parse_space(raw)
    assert _paths(info.value) == ["hyperparameters.a.low", "hyperparameters.b.choices"]


def test_sample_follows_only_the_picked_branch() -> None:
    space = parse_space(SPACE)
    seen_adam = seen_sgd = False
    rng = random.Random(0)
    for _ in range(50):
        values = space.sample(RandomSuggest(rng))
        assert 1e-4 <= values["lr"] <= 1e-1
        assert values["layers"] in (1, 2, 3, 4)
        assert values["epochs"] == 5
        if values["optimizer"] == "adam":
            seen_adam = True
            assert 0.8 <= values["beta1"] <= 0.99
        else:
            seen_sgd = True
            assert "beta1" not in values
    assert seen_adam
    assert seen_sgd


def test_grid_values_and_size() -> None:
    space = parse_space(
        {
            "lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1},
            "n": {"type": "int", "low": 2, "high": 8, "step": 3},
            "act": {"type": "categorical", "choices": ["relu", "tanh"]},
        }
    )
    assert space.grid() == {"lr": (0.1, 0.2, 0.3), "n": (2, 5, 8), "act": ("relu", "tanh")}
    assert space.grid_size() == 18


def _spec(searcher: str, space: str = "{lr: {type: float, low: 0.001, high: 0.1}}") -> str:
    return f"name: x\nentrypoint: python t.py\nhyperparameters: {space}\nsearcher: {searcher}\n"


@pytest.mark.parametrize(
    ("searcher", "space", "path"),
    [
        ("{sampler: tpe}", None, "searcher.metric"),
        ("{sampler: grid, metric: acc}", None, "hyperparameters.lr"),  # continuous, no step
        ("{pruner: asha, metric: acc}", None, "searcher.budget.max"),
        ("{name: pbt, metric: acc}", None, "searcher.budget.max"),
        ("{sampler: tpe, metric: acc, budget: {min: 5, max: 5}}", None, "searcher.budget.min"),
        ("{sampler: random, metric: acc}", "{lr: 0.1}", "hyperparameters"),
        (
            "{name: pbt, metric: acc, budget: {max: 9}, mutations: {wd: {type: float, low: 0, "
            "high: 1}}}",
            None,
            "searcher.mutations.wd",
        ),
        (
            "{name: pbt, metric: acc, budget: {max: 9}, perturbation_factors: [1.1, 1.2]}",
            None,
            "searcher.perturbation_factors",
        ),
        (
            "{sampler: grid, metric: acc}",
            "{o: {type: categorical, choices: [{value: a, params: "
            "{b: {type: int, low: 0, high: 2}}}]}}",
            "searcher.sampler",
        ),
        ("{sampler: annealing, metric: acc}", None, "searcher.sampler"),
    ],
)
def test_searcher_errors(searcher: str, space: str | None, path: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(_spec(searcher, space) if space else _spec(searcher))
    assert path in _paths(info.value), info.value.message


def test_searcher_shorthands_and_limits() -> None:
    spec = parse_spec(_spec("{name: asha, metric: acc, budget: {max: 27}}"))
    assert (spec.searcher.kind, spec.searcher.sampler_name, spec.searcher.pruner_name) == (
        "search",
        "random",
        "asha",
    )
    grid = parse_spec(
        _spec("{sampler: grid, metric: acc, max_trials: 100}", "{n: {type: int, low: 1, high: 3}}")
    )
    assert grid.searcher.trial_limit(grid.search_space) == 3  # the grid is smaller
    assert parse_spec(_spec("{sampler: tpe, metric: acc}")).searcher.pruner_name == "none"
    single = parse_spec("name: x\nentrypoint: python t.py\nhyperparameters: {lr: 0.1}\n")
    assert single.searcher.kind == "single"


# ---------------------------------------------------------------- PBT

CONFIG = PbtConfig(
    mode="max",
    quantile=0.25,
    interval=4,
    resample_probability=0.0,
    factors=(0.8, 1.2),
    mutable=(FloatParam("lr", 1e-3, 1.0), IntParam("width", 8, 64)),
)


def _member(trial_id: int, score: float | None, step: int = 4, due: int = 4) -> Member:
    return Member(trial_id, {"lr": 0.1, "width": 32}, score, step, 100 + trial_id, due)


def test_bottom_member_exploits_a_top_member() -> None:
    members = [_member(1, 0.9), _member(2, 0.5), _member(3, 0.6), _member(4, 0.1)]
    decisions = {d.trial_id: d for d in decide(members, CONFIG, random.Random(0))}
    exploit = decisions[4]
    assert isinstance(exploit, Exploit)
    assert (exploit.donor_id, exploit.checkpoint_id) == (1, 101)
    assert exploit.hparams["lr"] in (pytest.approx(0.08), pytest.approx(0.12))
    assert exploit.hparams["width"] in (26, 38)
    assert "bottom" in exploit.reason
    assert decisions[2] == Continue(2, 8)  # middle members carry on to the next interval


def test_min_mode_ranks_low_scores_first() -> None:
    members = [_member(1, 0.9), _member(2, 0.1), _member(3, 0.5), _member(4, 0.6)]
    config = PbtConfig("min", 0.25, 4, 0.0, (0.8, 1.2), CONFIG.mutable)
    exploits = [d for d in decide(members, config, random.Random(0)) if isinstance(d, Exploit)]
    assert [(e.trial_id, e.donor_id) for e in exploits] == [(1, 2)]


def test_nothing_is_decided_before_a_member_is_due() -> None:
    members = [_member(1, 0.9, step=3), _member(2, 0.1, step=3)]
    assert decide(members, CONFIG, random.Random(0)) == []
    # a lone scored member has nobody to be compared with
    assert decide([_member(1, 0.9), _member(2, None)], CONFIG, random.Random(0)) == []


def test_donor_without_checkpoint_is_not_used() -> None:
    members = [
        Member(1, {"lr": 0.1}, 0.9, 4, None, 4),
        Member(2, {"lr": 0.1}, 0.1, 4, 7, 4),
    ]
    assert decide(members, CONFIG, random.Random(0)) == [Continue(1, 8), Continue(2, 8)]


def test_explore_stays_in_range_and_resamples() -> None:
    config = PbtConfig("max", 0.25, 4, 1.0, (0.8, 1.2), CONFIG.mutable)
    rng = random.Random(1)
    for _ in range(100):
        out = explore({"lr": 1.0, "width": 64, "other": "x"}, config, rng)
        assert 1e-3 <= out["lr"] <= 1.0
        assert 8 <= out["width"] <= 64
        assert out["other"] == "x"
    clipped = explore({"lr": 1.0, "width": 64}, CONFIG, random.Random(3))
    assert clipped["lr"] <= 1.0
    assert clipped["width"] <= 64
