"""The spec's ``distill`` section: what it accepts and the field paths of what it refuses."""

from __future__ import annotations

import pytest

from trainhub.core.distill_spec import DistillSpec, parse_teacher
from trainhub.core.errors import InvalidSpec
from trainhub.core.spec import parse_spec

BASE = "name: kd\nentrypoint: python train.py\n"


def errors_of(section: str) -> list[tuple[str, str]]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(BASE + section)
    return [(e.path, e.message) for e in info.value.errors]


def test_a_full_section_parses_with_defaults() -> None:
    spec = parse_spec(
        BASE + "distill: {teacher: 'mnist-resnet:3', hints: [{student: features.3, "
        "teacher: blocks.4.conv1}]}\n"
    )
    assert spec.distill is not None
    assert (spec.distill.temperature, spec.distill.alpha, spec.distill.hint_weight) == (
        4.0,
        0.9,
        1.0,
    )
    ref = spec.distill.teacher_ref
    assert (ref.kind, ref.name, ref.version) == ("model", "mnist-resnet", 3)
    assert spec.distill.hints[0].teacher == "blocks.4.conv1"
    assert parse_spec(BASE).distill is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mnist", "mnist:latest"),
        ("mnist:latest", "mnist:latest"),
        ("vision/mnist:2", "vision/mnist:2"),
        ("trial:42", "trial:42"),
    ],
)
def test_teacher_references(text: str, expected: str) -> None:
    assert str(parse_teacher(text)) == expected


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ("distill: {temperature: 2}", "distill.teacher", "this field is required"),
        ("distill: {teacher: 'trial:0'}", "distill.teacher", "is not a teacher reference"),
        ("distill: {teacher: 'm:v2'}", "distill.teacher", "NAME:VERSION"),
        ("distill: {teacher: m, temperature: 0}", "distill.temperature", "greater than 0"),
        ("distill: {teacher: m, temperature: 1000}", "distill.temperature", "less than"),
        ("distill: {teacher: m, alpha: 1.5}", "distill.alpha", "less than or equal to 1"),
        ("distill: {teacher: m, hints: [{student: a}]}", "distill.hints.0.teacher", "required"),
        (
            "distill: {teacher: m, hints: [{student: 'a b', teacher: c}]}",
            "distill.hints.0.student",
            "pattern",
        ),
        ("distill: {teacher: m, temprature: 2}", "distill.temprature", "unknown field"),
        ("distill: {teacher: m, alfa: 2}", "distill.alfa", "unknown field"),
    ],
)
def test_mistakes_name_their_field(section: str, path: str, message: str) -> None:
    found = errors_of(section + "\n")
    assert any(p == path and message in m for p, m in found), found


def test_too_many_hints_are_refused() -> None:
    hints = ", ".join("{student: a, teacher: b}" for _ in range(17))
    found = errors_of(f"distill: {{teacher: m, hints: [{hints}]}}\n")
    assert [p for p, _ in found] == ["distill.hints"]


def test_the_runtime_reads_the_section_from_its_environment() -> None:
    env = {"TRAINHUB_DISTILL": '{"teacher": "trial:3", "alpha": 0.5}'}
    section = DistillSpec.from_env(env)
    assert section is not None
    assert section.alpha == 0.5
    assert section.teacher_ref.trial_id == 3
    assert DistillSpec.from_env({}) is None
    with pytest.raises(ValueError, match=r"^distill\.alpha: "):
        DistillSpec.from_env({"TRAINHUB_DISTILL": '{"teacher": "m", "alpha": -1}'})


def test_a_misspelt_field_gets_the_sections_own_suggestion() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(BASE + "distill: {teacher: m, temprature: 2}\n")
    (error,) = info.value.errors
    assert "did you mean 'temperature'?" in error.hint
    assert "hint_weight" in error.hint


def test_both_sides_name_the_same_variable() -> None:
    from trainhub.distill_contract import ENV_DISTILL
    from trainhub.runtime import protocol

    assert protocol.ENV_DISTILL == ENV_DISTILL
