"""The spec's model section and the suggest ranking: plain values."""

from __future__ import annotations

import pytest

from trainhub.core.errors import InvalidSpec
from trainhub.core.model_fit import Candidate, Problem, parse_shape, rank_models, recorded_accuracy
from trainhub.core.model_spec import ModelRef, parse_model_ref
from trainhub.core.spec import parse_spec

MNIST = Problem("image-classification", (1, 28, 28), 10)


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("base", ModelRef(name="base")),
        ("base:3", ModelRef(name="base", version=3)),
        ("vision/base:3", ModelRef(name="base", version=3, tenant="vision")),
        ("trial:42", ModelRef(trial_id=42)),
    ],
)
def test_model_refs_parse_and_print_back(text: str, ref: ModelRef) -> None:
    assert parse_model_ref(text) == ref
    assert str(ref) == text


@pytest.mark.parametrize("text", ["base:x", "base:0", "trial:", "trial:-1", "a b", "x/y/z:1", ""])
def test_bad_model_refs_say_which_forms_exist(text: str) -> None:
    with pytest.raises(ValueError, match="use NAME, NAME:VERSION"):
        parse_model_ref(text)


def test_the_model_section_is_validated_with_field_paths() -> None:
    spec = parse_spec(
        "name: ft\nentrypoint: python t.py\n"
        "model: {init_from: 'base:2', freeze: [features.*], grow: {wider: {fc1: 2.0}}}\n"
    )
    assert spec.model.ref == ModelRef(name="base", version=2)
    assert spec.model.grow is not None
    assert spec.model.grow.wider == {"fc1": 2.0}
    with pytest.raises(InvalidSpec) as caught:
        parse_spec("name: ft\nentrypoint: python t.py\nmodel: {grow: {wider: {fc1: 0.5}}}\n")
    assert caught.value.errors[0].path == "model.grow.wider.fc1"
    with pytest.raises(InvalidSpec) as caught:
        parse_spec("name: ft\nentrypoint: python t.py\nmodel: {init_from: 'trial:x'}\n")
    assert caught.value.errors[0].path == "model.init_from"


def _zoo(ref: str, params: int, shape: tuple[int, ...] = (1, 28, 28)) -> Candidate:
    return Candidate(ref, "zoo", "image-classification", shape, 10, params, adapts_to_input=True)


def test_a_trained_model_of_the_same_shape_and_classes_ranks_first() -> None:
    trained = Candidate(
        "vision/lenet:2",
        "registry",
        "image-classification",
        (1, 28, 28),
        10,
        61_706,
        {"val_accuracy": 0.98},
    )
    other_classes = Candidate(
        "vision/cifar:1",
        "registry",
        "image-classification",
        (3, 32, 32),
        100,
        270_000,
        {"acc": 71.0},
    )
    text = Candidate("nlp/bert:1", "registry", "text-classification", None, 10, 1_000, {})
    fits = rank_models(
        [
            _zoo("zoo:resnet18", 11_000_000),
            other_classes,
            text,
            trained,
            _zoo("zoo:lenet5", 61_706),
        ],
        MNIST,
    )
    assert [f.candidate.ref for f in fits] == [
        "vision/lenet:2",
        "zoo:lenet5",  # untrained: smaller first among equals
        "zoo:resnet18",
        "vision/cifar:1",  # other channels and classes
    ]
    assert "other channels: reset the first layer" in fits[-1].reasons
    assert "100 classes: reset the head" in fits[-1].reasons
    assert fits[0].accuracy == pytest.approx(0.98)
    assert recorded_accuracy({"acc": 71.0}) == pytest.approx(0.71)


def test_shapes_parse_from_the_command_line() -> None:
    assert parse_shape("1x28x28") == (1, 28, 28)
    assert parse_shape("3,32,32") == (3, 32, 32)
    with pytest.raises(ValueError, match="CxHxW"):
        parse_shape("28 by 28")
