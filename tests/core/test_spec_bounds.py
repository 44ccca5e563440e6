"""The spec's bounds, as plain values: size, depth, alias expansion, integers, NUL bytes."""

from __future__ import annotations

import time

import pytest

from trainhub.core import limits
from trainhub.core.errors import InvalidSpec
from trainhub.core.spec import parse_spec

BASE = "name: demo\nentrypoint: python train.py\n"


def refusal(text: str) -> str:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(text)
    return caught.value.message


def test_aliases_are_budgeted_before_they_expand() -> None:
    levels = "".join(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    started = time.monotonic()
    message = refusal(BASE + "hyperparameters:\n  a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + levels)
    assert time.monotonic() - started < 0.1
    assert "aliases" in message
    # a long scalar aliased many times counts by its characters
    many = ", ".join(["*s"] * 100)
    assert "aliases" in refusal(
        BASE + f"description: &s {'x' * 5000}\nhyperparameters: {{l: [{many}]}}\n"
    )
    # ordinary aliases are fine
    spec = parse_spec(BASE + "hyperparameters: {a: &a [1, 2], b: *a}\n")
    assert spec.hyperparameters == {"a": [1, 2], "b": [1, 2]}


def test_a_recursive_alias_is_refused() -> None:
    assert "contains it" in refusal(BASE + "hyperparameters: &a {x: *a}\n")


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 33,
        "[ " * 33,
        "\n  - " + "[ {a: " * 17,
        "\n" + "".join(" " * i + "- \n" for i in range(1, 40)),
    ],
)
def test_nesting_deeper_than_the_bound_is_refused(nested: str) -> None:
    assert f"deeper than {limits.MAX_SPEC_DEPTH}" in refusal(BASE + "x: " + nested)


def test_brackets_inside_scalars_and_comments_are_not_nesting() -> None:
    deep = "[" * 40
    text = BASE + (
        f"description: '{deep}'\n"
        "hyperparameters:\n"
        f'  a: "{deep}\\" {deep}"   # {deep}\n'
        f"  b: x{deep}\n"
        f"  c: x {deep}\n"
        f"  d: {'[' * 30}1{']' * 30}\n"
        f"# {deep}\n"
    )
    assert set(parse_spec(text).hyperparameters) == {"a", "b", "c", "d"}


def test_size_and_integers() -> None:
    assert "65536 bytes" in refusal(BASE + "description: " + "x" * limits.MAX_SPEC_BYTES)
    assert "5000 digits" in refusal(BASE + "hyperparameters: {x: " + "9" * 5000 + "}\n")
    assert "hyperparameters.x" in refusal(BASE + f"hyperparameters: {{x: {2**63}}}\n")
    assert parse_spec(BASE + f"hyperparameters: {{x: {2**63 - 1}}}\n").hyperparameters["x"]
    assert "not a finite number" in refusal(BASE + "hyperparameters: {x: .nan}\n")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('name: d\nentrypoint: "python train.py\\0"\n', "entrypoint"),
        (BASE + 'environment: {variables: {A: "\\0"}}\n', "environment.variables"),
        (BASE + 'environment: {variables: {"A=B": "1"}}\n', "environment.variables"),
        (BASE + "resources: {memory_gb_per_worker: .inf}\n", "resources.memory_gb_per_worker"),
        (BASE + "resources: {memory_gb_per_worker: 1e300}\n", "resources.memory_gb_per_worker"),
        (BASE + "resources: {cpus_per_worker: 1e-300}\n", "resources.cpus_per_worker"),
        (BASE + "searcher: {metric: 'a b'}\n", "searcher.metric"),
    ],
)
def test_what_a_launch_cannot_take_is_refused(text: str, path: str) -> None:
    assert refusal(text).startswith(path)
