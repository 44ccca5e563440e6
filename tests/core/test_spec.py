from __future__ import annotations

import pytest

from trainhub.core.errors import InvalidSpec
from trainhub.core.spec import (
    ExperimentSpec,
    Placement,
    check_entrypoint_exists,
    entrypoint_script,
    parse_spec,
)

GOOD = """
name: mnist-lenet
project: vision
entrypoint: python train.py --epochs 5
resources: {workers: 2, gpus_per_worker: 0, cpus_per_worker: 1, placement: spread}
hyperparameters: {lr: 0.01, batch_size: 64, epochs: 5}
searcher: {metric: val_accuracy, mode: max}
max_restarts: 2
"""


def paths(exc: InvalidSpec) -> list[str]:
    return [e.path for e in exc.errors]


def test_good_spec_parses_with_defaults() -> None:
    spec = parse_spec(GOOD)
    assert spec.resources.workers == 2
    assert spec.resources.placement == Placement.SPREAD
    assert spec.hyperparameters["lr"] == 0.01
    assert spec.checkpoints.keep_latest == 1
    assert spec.entrypoint_argv == ["python", "train.py", "--epochs", "5"]


def test_unknown_field_is_named_with_a_suggestion() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec("name: x\nentrypoint: python t.py\nresources: {wokers: 2}\n")
    (error,) = info.value.errors
    assert error.path == "resources.wokers"
    assert "did you mean 'workers'" in error.hint


def test_wrong_types_and_impossible_values_are_reported_together() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(
            "name: x\nentrypoint: python t.py\nresources: {workers: 0, cpus_per_worker: two}\n"
            "max_restarts: -1\npriority: asap\n"
        )
    assert set(paths(info.value)) == {
        "resources.workers",
        "resources.cpus_per_worker",
        "max_restarts",
        "priority",
    }


def test_missing_required_fields() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec("project: p\n")
    assert set(paths(info.value)) == {"name", "entrypoint"}


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec("name: x\nentrypoint: [unclosed\n")
    assert "line" in info.value.errors[0].message


def test_not_a_mapping() -> None:
    with pytest.raises(InvalidSpec, match="mapping"):
        parse_spec("- a\n- b\n")


def test_a_distribution_needs_a_search_searcher() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(
            "name: x\nentrypoint: python t.py\n"
            "hyperparameters: {lr: {type: float, low: 0.001, high: 0.1}}\n"
        )
    assert paths(info.value) == ["hyperparameters.lr"]
    assert "single" in info.value.errors[0].message


@pytest.mark.parametrize(
    ("entrypoint", "script"),
    [
        ("python train.py", "train.py"),
        ("python -u src/train.py --x 1", "src/train.py"),
        ("python3 -W ignore train.py", "train.py"),
        ("torchrun --nproc-per-node 2 train.py", "train.py"),
        ("./run.sh", "./run.sh"),
        ("python -m pkg.train", None),
        ("bash -c 'echo hi'", None),
    ],
)
def test_entrypoint_script(entrypoint: str, script: str | None) -> None:
    assert entrypoint_script(entrypoint) == script


def test_missing_entrypoint_file_is_rejected() -> None:
    spec = ExperimentSpec(name="x", entrypoint="python train.py")
    check_entrypoint_exists(spec, {"train.py", "lib/x.py"})
    with pytest.raises(InvalidSpec) as info:
        check_entrypoint_exists(spec, {"other.py"})
    assert paths(info.value) == ["entrypoint"]


def test_a_key_written_twice_is_refused_at_its_field_path() -> None:
    from trainhub.core.errors import InvalidSpec
    from trainhub.core.spec import parse_spec

    text = (
        "name: demo\nentrypoint: python train.py\n"
        "hyperparameters:\n  lr: 0.1\n  epochs: 3\n  lr: 0.01\n"
    )
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(text)
    (error,) = refused.value.errors
    assert error.path == "hyperparameters.lr"
    assert "lines 4 and 6" in error.message
    # the same key in two mappings, and YAML merge keys, are not duplicates
    parse_spec(
        "name: demo\nentrypoint: python train.py\n"
        "hyperparameters: {lr: 0.1}\nsearcher: {metric: lr}\n"
    )
