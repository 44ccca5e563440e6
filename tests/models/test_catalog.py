"""``trainhub models suggest``: the zoo built for the problem, beside registered versions."""

from __future__ import annotations

from trainhub.core.model_fit import Problem

MNIST = Problem("image-classification", (1, 28, 28), 10)


def test_suggest_ranks_zoo_models_built_for_the_problem() -> None:
    from trainhub.models.catalog import suggest

    registered = [
        {
            "latest": {
                "ref": "vision/digits-lenet:1",
                "arch": {"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]},
                "metrics": {"val_accuracy": 0.97},
            }
        }
    ]
    fits = suggest(MNIST, registered)
    refs = [f.candidate.ref for f in fits]
    assert refs[0] == "vision/digits-lenet:1"
    assert set(refs[1:]) == {
        "zoo:lenet5",
        "zoo:mlp",
        "zoo:resnet18",
        "zoo:resnet20",
        "zoo:transformer",
    }
    assert fits[0].candidate.num_parameters == 61_706
    # 8x8 digits: LeNet cannot take them, so it is not offered
    small = suggest(Problem("image-classification", (1, 8, 8), 10))
    assert "zoo:lenet5" not in [f.candidate.ref for f in small]


def test_architectures_designed_for_the_input_come_first_among_untrained() -> None:
    from trainhub.models.catalog import suggest

    cifar = [f.candidate.ref for f in suggest(Problem("image-classification", (3, 32, 32), 100))]
    assert cifar[:2] == ["zoo:resnet20", "zoo:resnet18"]
    mnist = [f.candidate.ref for f in suggest(MNIST)]
    assert mnist[0] == "zoo:lenet5"


def test_a_version_whose_weights_do_not_load_is_never_ranked() -> None:
    from trainhub.models.catalog import left_out, suggest

    arch = {"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]}

    def version(n: int, fit: bool | None, problem: str = "") -> dict[str, object]:
        return {
            "ref": f"vision/digits:{n}",
            "version": n,
            "arch": arch,
            "metrics": {"val_accuracy": 0.5 + n / 10},
            "weights_fit": fit,
            "weights_problem": problem,
        }

    broken = version(3, False, "missing features.0.weight")
    registered = [
        {"latest": broken, "versions": [version(1, None), version(2, True), broken]},
        {"latest": version(1, False, "unexpected fc3.weight") | {"ref": "vision/hand:1"}},
    ]
    refs = [f.candidate.ref for f in suggest(MNIST, registered)]
    assert "vision/digits:2" in refs  # the newest version that loads stands for the model
    assert "vision/digits:3" not in refs
    assert "vision/hand:1" not in refs  # no version of it loads: not offered at all
    assert left_out(registered) == [
        ("vision/digits:3", "missing features.0.weight"),
        ("vision/hand:1", "unexpected fc3.weight"),
    ]
