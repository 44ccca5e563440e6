"""The zoo core names (to check specs without torch) is the zoo trainhub.models builds."""

from __future__ import annotations

from trainhub import models
from trainhub.core.model_spec import ZOO_MODELS, zoo_error


def test_core_names_the_zoo_models_builds() -> None:
    assert sorted(ZOO_MODELS) == models.available()


def test_an_unknown_zoo_name_is_named_with_a_suggestion() -> None:
    assert zoo_error("LeNet-5", "model.arch.zoo") is None  # as models.create reads names
    error = zoo_error("resnet50", "model.arch.zoo")
    assert error is not None
    assert error.path == "model.arch.zoo"
    assert error.message == "unknown zoo model 'resnet50'"
    assert error.hint.startswith("did you mean 'resnet20'? the zoo: lenet5, mlp")
