"""The searcher-metric warning and when a trial fails for it (core/searcher_metric.py)."""

from __future__ import annotations

from trainhub.core.searcher_metric import (
    experiment_warning,
    failure_at_end,
    suggestion,
    trial_warning,
)
from trainhub.core.searcher_spec import SearcherSpec


def test_a_typo_is_suggested_from_the_names_reported() -> None:
    assert suggestion("val_acc", ["train_loss", "val_accuracy"]) == "val_accuracy"
    assert suggestion("val-accuracy", ["Val_Accuracy"]) == "Val_Accuracy"
    assert suggestion("val_loss", ["throughput/samples_per_s"]) is None


def test_a_typo_past_the_first_rung_is_a_certain_warning() -> None:
    warning = trial_warning(
        "val_acc", {"train_loss": 0.4, "val_accuracy": 0.9, "step": 1}, latest_step=1
    )
    assert warning is not None
    assert warning.certain
    assert warning.suggestion == "val_accuracy"
    assert "searcher metric 'val_acc' is not reported" in warning.message
    assert "did you mean 'val_accuracy'?" in warning.message
    assert "train_loss, val_accuracy" in warning.message


def test_no_warning_before_the_first_rung_or_once_reported() -> None:
    assert trial_warning("val_acc", {"val_accuracy": 0.9}, latest_step=0) is None
    assert trial_warning("val_acc", {"val_acc": 0.9}, latest_step=5) is None
    assert trial_warning("val_acc", {}, latest_step=None, ended=True) is None
    assert trial_warning(None, {"loss": 1.0}, latest_step=9) is None


def test_a_different_metric_reported_earlier_is_a_warning_not_a_failure() -> None:
    # loss every step, val_loss only at the end of an epoch: not a typo of it
    warning = trial_warning("val_loss", {"loss": 0.3}, latest_step=40)
    assert warning is not None
    assert not warning.certain
    assert trial_warning("val_loss", {"train_loss": 0.3}, latest_step=3, first_rung=5) is None
    ended = trial_warning("val_loss", {"loss": 0.3}, latest_step=40, ended=True)
    assert ended is not None
    assert ended.certain


def test_a_trial_that_requires_the_metric_fails_at_its_end_without_it() -> None:
    search = SearcherSpec(sampler="tpe", metric="val_acc")
    assert search.requires_metric
    said = failure_at_end(search, {"val_accuracy": 0.9, "step": 3})
    assert said is not None
    assert "did you mean 'val_accuracy'?" in said
    nothing = failure_at_end(search, {})
    assert nothing is not None
    assert "no metrics at all" in nothing
    assert failure_at_end(search, {"val_acc": 0.9}) is None
    relaxed = SearcherSpec(sampler="tpe", metric="val_acc", require_metric=False)
    assert failure_at_end(relaxed, {"val_accuracy": 0.9}) is None
    single = SearcherSpec(metric="val_acc")
    assert not single.requires_metric
    assert failure_at_end(single, {"val_accuracy": 0.9}) is None


def test_the_experiment_warns_when_no_trial_reported_the_metric() -> None:
    said = experiment_warning("val_acc", [{"val_accuracy", "step"}, {"train_loss"}])
    assert said is not None
    assert "no trial has reported searcher metric 'val_acc'" in said
    assert "did you mean 'val_accuracy'?" in said
    assert experiment_warning("val_acc", [{"val_accuracy"}, {"val_acc"}]) is None
    assert experiment_warning("val_acc", [set(), {"step"}]) is None
    assert experiment_warning(None, [{"loss"}]) is None
