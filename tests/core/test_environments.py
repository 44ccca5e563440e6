"""The pure rules of trial environments: what is refused, and the keys."""

from __future__ import annotations

import pytest

from trainhub.core.environments import (
    BaseIdentity,
    check_requirements,
    environment_key,
    layered_packages,
    request_key,
    requirement_lines,
)
from trainhub.core.errors import InvalidSpec
from trainhub.core.spec import validate_spec

BASE = {"torch": "2.13.0+cpu", "trainhub": "0.1.0", "numpy": "2.1.0"}
IDENTITY = BaseIdentity.of("3.11.9", BASE.items())


def _problems(*lines: str) -> list[str]:
    return [e.message for e in check_requirements(list(lines), "environment.packages", BASE)]


def test_plain_packages_are_accepted() -> None:
    assert _problems("einops==0.8.1", "timm", "humanize>=4; python_version >= '3.8'") == []


@pytest.mark.parametrize("line", ["torch", "torch>=2.0", "torch==2.13.0", "trainhub"])
def test_the_base_torch_and_trainhub_may_be_named(line: str) -> None:
    assert _problems(line) == []


@pytest.mark.parametrize("line", ["torch==2.1.0", "torch<2", "trainhub>=9"])
def test_another_torch_or_trainhub_is_refused_saying_which_the_base_has(line: str) -> None:
    errors = check_requirements([line], "environment.packages", BASE)
    assert len(errors) == 1
    assert errors[0].path == "environment.packages[0]"
    assert "cannot be replaced" in errors[0].message
    assert "remove the" in errors[0].hint


def test_pip_options_and_garbage_are_refused_per_line() -> None:
    errors = check_requirements(
        ["six", "-r other.txt", "not a requirement!!"], "environment.packages", BASE
    )
    assert [e.path for e in errors] == ["environment.packages[1]", "environment.packages[2]"]
    assert "pip options" in errors[0].message
    assert "not a requirement" in errors[1].message


def test_requirement_lines_drop_comments_and_blanks() -> None:
    text = "# tools\neinops==0.8.1  # tensors\n\n  humanize\n"
    assert requirement_lines(text) == ["einops==0.8.1", "humanize"]


def test_keys_depend_on_the_lock_python_and_base() -> None:
    lock = "einops==0.8.1\nhumanize==4.9.0\n"
    same = environment_key("humanize==4.9.0\n# c\neinops==0.8.1", IDENTITY)
    assert environment_key(lock, IDENTITY) == same
    other_python = BaseIdentity.of("3.12.1", BASE.items())
    other_base = BaseIdentity.of("3.11.9", {**BASE, "numpy": "2.2.0"}.items())
    assert environment_key(lock, other_python) != same
    assert environment_key(lock, other_base) != same
    assert environment_key("einops==0.8.0\nhumanize==4.9.0", IDENTITY) != same
    assert request_key(["b", "a"], IDENTITY) == request_key(["a", "b", "a"], IDENTITY)
    assert request_key(["a"], IDENTITY) != environment_key("a", IDENTITY)


def test_the_layer_installs_only_what_the_base_lacks() -> None:
    lock = "einops==0.8.1\nnumpy==2.1.0\ntorch==2.13.0\nnumpy-extra==1.0\n"
    assert layered_packages(lock, BASE) == ["einops==0.8.1", "numpy-extra==1.0"]


def test_spec_takes_requirements_or_packages_beside_variables() -> None:
    spec = validate_spec(
        {
            "name": "x",
            "entrypoint": "python train.py",
            "environment": {
                "variables": {"A": "1"},
                "requirements": "./deps/requirements.txt",
                "packages": ["einops==0.8.1"],
            },
        }
    )
    assert spec.environment.requirements == "deps/requirements.txt"
    assert spec.environment.wants_packages
    plain = validate_spec({"name": "x", "entrypoint": "python t.py", "environment": {}})
    assert not plain.environment.wants_packages


@pytest.mark.parametrize("path", ["/etc/passwd", "../up.txt", "a/../../b"])
def test_spec_refuses_a_requirements_path_outside_the_code(path: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        validate_spec(
            {"name": "x", "entrypoint": "python t.py", "environment": {"requirements": path}}
        )
    assert info.value.errors[0].path == "environment.requirements"
