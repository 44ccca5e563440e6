"""Preempting a plain script (issue 8, executor side): ``terminate(attempt, grace_s)`` sends
SIGTERM to the script, SIGKILL to the whole tree after ``grace_s``; ``TRAINHUB_CHECKPOINT_DIR``
is the trial's folder that the next attempt finds again. Run with and without the sandbox."""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.adapters.sandbox import bwrap_problem
from trainhub.service.ports import AttemptLaunch, AttemptPhase

pytestmark = pytest.mark.ray

# torchrun's elastic-restart convention: save on SIGTERM, resume from the folder on start
COOPERATIVE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    path = os.path.join(os.environ["TRAINHUB_CHECKPOINT_DIR"], "state.json")
    step = json.load(open(path))["step"] if os.path.exists(path) else 0
    print("resumed from", step, flush=True)

    def save(signum, frame):
        json.dump({"step": step}, open(path, "w"))
        print("saved at", step, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    while True:
        step += 1
        print("step", step, flush=True)
        time.sleep(0.05)
    """
)

STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print("ignoring SIGTERM", flush=True)
    while True:
        time.sleep(0.05)
    """
)

MODES = ["none", "bwrap"]


@pytest.fixture(params=MODES)
def executor(request: pytest.FixtureRequest, ray_executor: RayExecutor) -> RayExecutor:
    if request.param == "bwrap" and (problem := bwrap_problem()) is not None:
        pytest.skip(f"no sandbox here: {problem}")
    return RayExecutor(
        ray_executor.address,
        namespace=TEST_NAMESPACE,
        sandbox=request.param,
        fail_fast_grace_s=None,
    )


def launch(executor: RayExecutor, script: str, trial_id: int, attempt: int) -> Watch:
    node = executor.cluster_nodes()[0].node_id
    spec = AttemptLaunch(
        attempt_key=new_attempt_key(f"pre{attempt}"),
        trial_id=trial_id,
        attempt=attempt,
        argv=("python", "train.py"),
        context_archive=make_context({"train.py": script}),
        env={},
        placement=(node,),
    )
    executor.launch(spec)
    return Watch(executor, spec.attempt_key)


def test_sigterm_saves_and_the_next_attempt_resumes(executor: RayExecutor) -> None:
    trial_id = int(time.time() * 1000) % 1_000_000_000  # a trial of its own
    first = launch(executor, COOPERATIVE, trial_id, 1)
    try:
        first.until(lambda s: "step 5" in first.text(0), timeout_s=60)
        started = time.monotonic()
        executor.terminate(first.attempt_key, grace_s=30.0)
        status = first.until_phase(AttemptPhase.EXITED, timeout_s=30)
        assert time.monotonic() - started < 10.0  # it ended by itself, long before the grace
        assert status.ranks[0].exit_code == 0, first.text(0)
        saved = int(first.text(0).split("saved at ")[1].split()[0])
        assert saved >= 5
    finally:
        executor.release(first.attempt_key)

    second = launch(executor, COOPERATIVE, trial_id, 2)
    try:
        second.until(lambda s: "resumed from" in second.text(0), timeout_s=60)
        assert f"resumed from {saved}\n" in second.text(0)
    finally:
        executor.release(second.attempt_key)


def test_a_script_ignoring_sigterm_is_killed_after_the_grace_period(
    executor: RayExecutor,
) -> None:
    watch = launch(executor, STUBBORN, 7, 1)
    try:
        watch.until(lambda s: "ignoring SIGTERM" in watch.text(0), timeout_s=60)
        time.sleep(0.3)  # its child is up
        started = time.monotonic()
        executor.terminate(watch.attempt_key, grace_s=1.5)
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=30)
        waited = time.monotonic() - started
        assert 1.5 <= waited < 8.0
        assert status.ranks[0].exit_code == -9
    finally:
        executor.release(watch.attempt_key)
