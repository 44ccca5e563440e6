"""Failures that will always repeat are not retried (core/failures.py, applied by the loop)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.states import TrialState
from trainhub.service.tracking import TrackingService

SPEC = "name: demo\nentrypoint: python -c pass\nresources: {cpus_per_worker: 1}\n"
MISSING = (
    b"Traceback (most recent call last):\n"
    b'  File "/tmp/ctx-%d/train.py", line 3, in <module>\n'
    b"    import sklearnx\n"
    b"ModuleNotFoundError: No module named 'sklearnx'\n"
)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[LoopHarness]:
    harness = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(1))
    yield harness
    harness.close()


def run_attempt(h: LoopHarness, trial_id: int) -> str:
    h.tick()
    key = h.key(trial_id)
    h.executor.run(key)
    h.tick()
    return key


def test_an_import_error_twice_before_any_report_is_not_retried_again(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 3\n")
    key = run_attempt(h, trial_id)
    h.executor.exit(key, [1], {0: MISSING % 1})
    h.tick()  # attempt 1 failed: retried once, and the message names the module
    first = h.trial(trial_id)
    assert first.state in (TrialState.QUEUED, TrialState.SCHEDULED)
    assert first.num_restarts == 1
    assert "module 'sklearnx' is not installed" in (h.attempts(trial_id)[0].detail or "")
    assert "docs/environments.md" in (h.attempts(trial_id)[0].detail or "")
    key = run_attempt(h, trial_id)
    h.executor.exit(key, [1], {0: MISSING % 2})  # the same failure, another temp path
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert trial.num_restarts == 1
    assert len(h.attempts(trial_id)) == 2
    assert trial.message is not None
    assert "failed the same way twice before training started" in trial.message
    assert "module 'sklearnx' is not installed" in trial.message


def test_a_different_second_failure_is_retried(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 2\n")
    key = run_attempt(h, trial_id)
    h.executor.exit(key, [1], {0: MISSING % 1})
    h.tick()
    key = run_attempt(h, trial_id)
    h.executor.exit(key, [1], {0: b"FileNotFoundError: data/train.csv\n"})
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state != TrialState.FAILED
    assert trial.num_restarts == 2


def test_the_same_failure_after_reports_is_retried(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 2\n")
    tracking = TrackingService(h.uow, h.store, h.clock)
    key = run_attempt(h, trial_id)
    tracking.record_metrics(h.principal, trial_id, 1, [(1, {"loss": 0.5})])
    oom = b"RuntimeError: CUDA out of memory\n"
    h.executor.exit(key, [1], {0: oom})
    h.tick()
    key = run_attempt(h, trial_id)
    h.executor.exit(key, [1], {0: oom})
    h.tick()
    assert h.trial(trial_id).num_restarts == 2  # it trained before: worth another try


def test_a_program_that_cannot_be_executed_is_not_retried(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 3\n")
    key = run_attempt(h, trial_id)
    said = b"setpriv: failed to execute python: No such file or directory\n"
    h.executor.exit(key, [127], {0: said})
    h.tick()
    trial = h.trial(trial_id)
    assert (trial.state, trial.num_restarts) == (TrialState.FAILED, 0)
    assert trial.message is not None
    assert "setpriv: failed to execute python" in trial.message
    assert "the entrypoint's program cannot be executed (exit code 127" in trial.message
    assert len(h.attempts(trial_id)) == 1
