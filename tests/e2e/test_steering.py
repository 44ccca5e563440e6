"""End to end: searches and steering through one real control plane, Ray and training processes.

One control plane (SQLite, the session's Ray head) serves the whole module: ASHA on digits to the
accuracy target, a PBT member restarting from its donor's checkpoint, pause and resume of a trial
and of an experiment, a trial cloned with changes from its checkpoint, and a plain torchrun script
pruned through the SIGTERM path. Every check reads what the system recorded (states, attempts,
checkpoints, metrics the processes reported, Ray's placement groups), never a log line alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fixtures.control_plane import ControlPlaneProcess, rank_pids
from trainhub.service.keys import attempt_key

if TYPE_CHECKING:
    from trainhub.adapters.ray_executor import RayExecutor

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

WORKLOAD = Path(__file__).parent / "search_workload"
FAST_SIGNALS = {"TRAINHUB_SIGNALS_POLL_S": "0.3", "TRAINHUB_METRICS_BATCH_S": "0.1"}
STEPS = 20  # of the pause and resume test's trials
# the accuracy the digits example promises (examples/mnist/experiment.yaml)
DIGITS_TARGET = 0.95


@pytest.fixture(scope="module")
def plane(
    ray_address: str, ray_executor: RayExecutor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlaneProcess]:
    """One control plane for the module; a plain script that never asks gets SIGTERM after 1 s."""
    home = tmp_path_factory.mktemp("steer-home")
    control_plane = ControlPlaneProcess(home, ray_address, settings={"stop_wait_s": 1.0})
    control_plane.start()
    try:
        yield control_plane
    finally:
        for experiment in control_plane.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                control_plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        control_plane.stop()


def spec(body: str) -> str:
    variables = ", ".join(f"{k}: {v!r}" for k, v in FAST_SIGNALS.items())
    return f"{body.strip()}\nenvironment: {{variables: {{{variables}}}}}\n"


def until(plane: ControlPlaneProcess, what: str, check: Callable[[], Any], timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never {what}\n{plane.log_tail(60)}"
        time.sleep(0.25)


def experiment(plane: ControlPlaneProcess, experiment_id: int) -> dict[str, Any]:
    return dict(plane.request("GET", f"/experiments/{experiment_id}").json())


def search(plane: ControlPlaneProcess, experiment_id: int) -> dict[str, Any]:
    return dict(plane.request("GET", f"/experiments/{experiment_id}/search").json())


def finished(plane: ControlPlaneProcess, experiment_id: int, timeout_s: float = 120) -> dict:
    until(
        plane,
        f"experiment {experiment_id} ended",
        lambda: experiment(plane, experiment_id)["state"] != "ACTIVE",
        timeout_s,
    )
    return search(plane, experiment_id)


def first_points(metrics: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The first report of each attempt (the workload marks it), by attempt number."""
    return {
        int(p["values"]["attempt"]): {"step": p["step"], **p["values"]}
        for p in metrics
        if "restored_from" in p["values"]
    }


def holds_slots(trial_id: int, attempt: int) -> bool:
    """Whether Ray still holds the attempt's placement group (its CPUs and GPUs)."""
    import ray

    key = attempt_key(trial_id, attempt)
    table = ray.util.placement_group_table().values()
    return any(pg["name"] == key and pg["state"] != "REMOVED" for pg in table)


def test_asha_on_digits_prunes_and_reaches_the_accuracy_target(
    plane: ControlPlaneProcess,
) -> None:
    body = """
name: e2e-asha-digits
entrypoint: python digits.py
resources: {cpus_per_worker: 1}
hyperparameters:
  lr: {type: float, low: 1.0e-3, high: 3.0e-2, log: true}
  hidden: {type: categorical, choices: [16, 64]}
  epochs: 9
  sleep_s: 0.2
searcher: {sampler: tpe, pruner: asha, metric: val_accuracy, max_trials: 4,
           max_concurrent_trials: 4, budget: {unit: epochs, min: 1, max: 9},
           reduction_factor: 3, seed: 0}
"""
    experiment_id = plane.submit(spec(body), WORKLOAD)["id"]
    progress = finished(plane, experiment_id)
    rows = progress["data"]
    states = sorted(r["state"] for r in rows)
    assert progress["search_state"] == "FINISHED"
    assert len(rows) == 4, states
    assert set(states) <= {"PRUNED", "COMPLETED"}, states
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    assert pruned, states
    assert all(r["stop_detail"].startswith("pruned by the asha pruner") for r in pruned)
    # a pruned trial stopped early: fewer epochs than the budget
    assert all(r["epochs"] < 9 for r in pruned), pruned
    best = progress["best"]
    assert best["state"] == "COMPLETED"
    assert best["metric"] >= DIGITS_TARGET, rows
    assert best["epochs"] == 9
    # the best metric is what the trial's process reported
    reported = [p["values"]["val_accuracy"] for p in plane.metrics(best["id"])]
    assert max(reported) == pytest.approx(best["metric"])


def test_pbt_member_restarts_from_its_donors_checkpoint_with_new_hparams(
    plane: ControlPlaneProcess,
) -> None:
    body = """
name: e2e-pbt
entrypoint: python train.py
resources: {cpus_per_worker: 1}
hyperparameters:
  q: {type: float, low: 0.1, high: 0.9}
  steps: 8
  sleep_s: 0.4
searcher: {name: pbt, metric: acc, population: 2, perturbation_interval: 2, quantile: 0.5,
           budget: {unit: steps, max: 8}, max_trials: 3, seed: 1, resample_probability: 0.0}
checkpoints: {keep_latest: 20}
"""
    experiment_id = plane.submit(spec(body), WORKLOAD)["id"]
    progress = finished(plane, experiment_id)
    assert progress["search_state"] == "FINISHED"
    rows = {r["id"]: r for r in progress["data"]}
    children = [r for r in rows.values() if r["parent_trial_id"] is not None]
    assert len(rows) == 3, rows
    assert len(children) == 1, rows
    child = children[0]
    donor = rows[child["parent_trial_id"]]
    (replaced,) = [r for r in rows.values() if r["id"] not in (child["id"], donor["id"])]
    assert replaced["state"] == "PRUNED"
    assert replaced["stop_detail"].startswith("pbt:"), replaced
    assert f"copy of trial {donor['id']}" in replaced["stop_detail"]
    assert child["state"] == "COMPLETED", child

    detail = plane.trial(child["id"])
    # the child was born with a copy of the donor's checkpoint and its first attempt restored it
    copied = [c for c in detail["checkpoints"] if c["uuid"].startswith(f"pbt-{child['id']}-")]
    assert len(copied) == 1, detail["checkpoints"]
    assert detail["attempts"][0]["restored_checkpoint_id"] == copied[0]["id"]
    donor_step = copied[0]["step"]
    # a whole perturbation interval trained (steps 0 and 1): the replacement is decided on the
    # report that completes it (issue 31), so the donor's checkpoint may be that step's
    assert donor_step >= 1
    # what the child's process saw: the donor's step from ctx.restore(), its own q in ctx.hparams
    first = first_points(plane.metrics(child["id"]))[1]
    assert first["restored_from"] == donor_step
    assert first["step"] == donor_step + 1
    assert first["hparam_q"] == pytest.approx(child["hparams"]["q"])
    assert child["hparams"]["q"] != pytest.approx(donor["hparams"]["q"])
    perturbed = {donor["hparams"]["q"] * f for f in (0.8, 1.2)}
    assert any(child["hparams"]["q"] == pytest.approx(min(max(v, 0.1), 0.9)) for v in perturbed)


def test_pause_and_resume_an_experiment_and_a_trial(plane: ControlPlaneProcess) -> None:
    body = """
name: e2e-pause
entrypoint: python train.py
resources: {cpus_per_worker: 1}
hyperparameters:
  q: {type: float, low: 0.1, high: 0.9}
  steps: 20
  sleep_s: 0.25
searcher: {sampler: random, metric: acc, max_trials: 2, max_concurrent_trials: 2, seed: 2}
"""
    experiment_id = plane.submit(spec(body), WORKLOAD)["id"]

    def trials() -> list[dict[str, Any]]:
        return [plane.trial(t["id"]) for t in experiment(plane, experiment_id)["trials"]]

    until(
        plane,
        "two trials running with checkpoints",
        lambda: (
            len(ts := trials()) == 2
            and all(t["state"] == "RUNNING" and t["checkpoints"] for t in ts)
        ),
    )
    first, second = (t["id"] for t in trials())
    assert holds_slots(first, 1)
    assert holds_slots(second, 1)

    # pause the whole experiment: every trial checkpoints, stops and frees its slots
    r = plane.request("POST", f"/experiments/{experiment_id}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["search_state"] == "PAUSED"
    until(plane, "both PAUSED", lambda: all(t["state"] == "PAUSED" for t in trials()))
    for trial in trials():
        assert trial["attempts"][-1]["ended_at"] is not None
        assert not holds_slots(trial["id"], trial["num_attempts"])
        assert not rank_pids(trial["id"], 0)
    paused_at = {t["id"]: t["checkpoints"][-1]["step"] for t in trials()}
    time.sleep(1.0)  # a paused search makes nothing and nothing restarts by itself
    assert [t["state"] for t in trials()] == ["PAUSED", "PAUSED"]
    assert search(plane, experiment_id)["search_state"] == "PAUSED"

    r = plane.request("POST", f"/experiments/{experiment_id}/resume")
    assert r.status_code == 200, r.text
    until(
        plane,
        "the first trial running again past its checkpoint",
        lambda: (
            (t := plane.trial(first))["state"] == "RUNNING"
            and t["checkpoints"][-1]["step"] > paused_at[first]
        ),
    )

    # pause one trial: the other trains on
    r = plane.request("POST", f"/trials/{first}/pause")
    assert r.status_code == 200, r.text
    until(plane, "the first trial PAUSED", lambda: plane.trial(first)["state"] == "PAUSED")
    paused = plane.trial(first)
    assert not holds_slots(first, paused["num_attempts"])
    assert plane.trial(second)["state"] in ("RUNNING", "COMPLETED")
    trial_paused_at = paused["checkpoints"][-1]["step"]
    assert trial_paused_at < STEPS, "paused after its last step: nothing left to resume"
    r = plane.request("POST", f"/trials/{first}/resume")
    assert r.status_code == 200, r.text

    progress = finished(plane, experiment_id)
    assert [r["state"] for r in progress["data"]] == ["COMPLETED", "COMPLETED"]
    assert progress["search_state"] == "FINISHED"
    resumes = {first: [paused_at[first], trial_paused_at], second: [paused_at[second]]}
    for trial_id, steps in resumes.items():
        trial = plane.trial(trial_id)
        attempts = trial["attempts"]
        assert len(attempts) == len(steps) + 1
        assert all(a["restored_checkpoint_id"] is not None for a in attempts[1:])
        metrics = plane.metrics(trial_id)
        # every step once, none lost; each later attempt went on from its checkpoint
        assert [p["step"] for p in metrics if "acc" in p["values"]] == list(range(1, STEPS + 1))
        firsts = first_points(metrics)
        assert firsts[1]["restored_from"] == -1
        for number, step in enumerate(steps, start=2):
            assert firsts[number]["restored_from"] == step, firsts
            assert firsts[number]["step"] == step + 1


def test_clone_a_trial_with_changes_warm_starts_from_its_checkpoint(
    plane: ControlPlaneProcess,
) -> None:
    from typer.testing import CliRunner

    from trainhub.cli.main import app

    body = """
name: e2e-clone-source
entrypoint: python train.py
resources: {cpus_per_worker: 1}
hyperparameters: {q: 0.3, steps: 3, sleep_s: 0.05}
searcher: {metric: acc}
"""
    source = plane.submit(spec(body), WORKLOAD)["trials"][0]["id"]
    done = plane.wait_for(source, lambda t: t["state"] == "COMPLETED", 90, "COMPLETED")
    checkpoint = done["checkpoints"][-1]
    assert checkpoint["step"] == 3

    env = {"TRAINHUB_URL": plane.url, "TRAINHUB_TOKEN": plane.token, "COLUMNS": "200"}
    args = ["clone", str(source), "--trial", "--set", "q=0.7", "--set", "steps=5"]
    result = CliRunner().invoke(app, [*args, "--from-checkpoint", str(source)], env=env)
    assert result.exit_code == 0, result.output
    clone = max(plane.request("GET", "/experiments").json()["data"], key=lambda e: e["id"])
    assert f"submitted exp {clone['id']}" in result.output
    trial_id = experiment(plane, clone["id"])["trials"][0]["id"]
    trial = plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", 90, "COMPLETED")
    assert trial["hparams"] == {"q": 0.7, "steps": 5, "sleep_s": 0.05}
    assert trial["attempts"][0]["restored_checkpoint_id"] == checkpoint["id"]
    metrics = plane.metrics(trial_id)
    assert [p["step"] for p in metrics] == [4, 5]
    first = first_points(metrics)[1]
    assert first["restored_from"] == 3
    assert first["hparam_q"] == 0.7


def test_plain_torchrun_trials_of_a_search_are_pruned_through_sigterm(
    plane: ControlPlaneProcess,
) -> None:
    body = """
name: e2e-plain-search
entrypoint: python plain_ddp.py --epochs 5 --sleep-s 0.3
resources: {workers: 2, cpus_per_worker: 1}
hyperparameters:
  q: {type: categorical, choices: [0.9, 0.02]}
searcher: {sampler: grid, pruner: asha, metric: val_accuracy, max_concurrent_trials: 2,
           budget: {unit: epochs, min: 1, max: 5}, reduction_factor: 3, seed: 0}
max_restarts: 0
"""
    experiment_id = plane.submit(spec(body), WORKLOAD)["id"]
    progress = finished(plane, experiment_id, timeout_s=150)
    rows = {r["hparams"]["q"]: r for r in progress["data"]}
    assert sorted(rows) == [0.02, 0.9], rows
    good, bad = rows[0.9], rows[0.02]
    assert good["state"] == "COMPLETED", good
    assert bad["state"] == "PRUNED", bad
    assert bad["stop_detail"].startswith("pruned by the asha pruner")
    detail = plane.trial(bad["id"])
    (attempt,) = detail["attempts"]
    # the script never asks should_stop(): the ranks ended by SIGTERM, before their last epoch
    assert any(e["kind"] == "sigterm" for e in detail["events"]), detail["events"]
    # -15 for a rank process killed by SIGTERM; 143 (128 + 15) where a sandbox reports it
    assert attempt["exit_codes"] in ([-15, -15], [143, 143]), attempt
    assert bad["epochs"] < 5
    assert "finished every epoch" not in plane.log(bad["id"], 0)
    assert "finished every epoch" in plane.log(good["id"], 0)
    assert not holds_slots(bad["id"], 1)
