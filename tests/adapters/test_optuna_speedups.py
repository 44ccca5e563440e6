"""scipy's log_ndtr in Optuna's TPE: the same values and samples (to rounding)."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.samplers._tpe import _truncnorm

from trainhub.adapters import optuna_speedups


def test_the_fast_log_cdf_is_optunas_function() -> None:
    assert optuna_speedups.install()
    assert optuna_speedups.install()  # idempotent
    assert _truncnorm._log_ndtr.__name__ == "fast_log_ndtr"
    values = np.concatenate([np.linspace(-200.0, 40.0, 4001), [-1e5, -38.0, -20.0, 0.0, 6.0]])
    slow = np.array([_truncnorm._log_ndtr_single(float(v)) for v in values])
    np.testing.assert_allclose(_truncnorm._log_ndtr(values), slow, rtol=1e-9, atol=1e-12)
    assert _truncnorm._log_ndtr(np.array([0.0]))[0] == math.log(0.5)


def test_tpe_samples_the_same_points_with_it() -> None:
    def suggestions() -> list[float]:
        sampler = optuna.samplers.TPESampler(seed=3, n_startup_trials=5)
        study = optuna.create_study(sampler=sampler)
        study.optimize(
            lambda t: (
                (math.log10(t.suggest_float("lr", 1e-5, 1.0, log=True)) + 2) ** 2
                + t.suggest_float("m", 0.0, 0.99)
            ),
            n_trials=25,
        )
        return [t.params["lr"] for t in study.trials]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    saved = _truncnorm._log_ndtr
    try:
        _truncnorm._log_ndtr = lambda a: np.frompyfunc(_truncnorm._log_ndtr_single, 1, 1)(a).astype(
            float
        )
        slow = suggestions()
    finally:
        _truncnorm._log_ndtr = saved
    assert optuna_speedups.install()
    assert suggestions() == pytest.approx(slow, rel=1e-12)
