"""End to end: the fair scheduler preempts plain scripts that never call should_stop().

A real control plane on the session's Ray head (8 CPU slots). Tenant ``borrow`` (no guarantee)
runs two plain scripts of 3 slots; tenant ``owner`` (guarantee 6) then asks for 6. Both
borrowers are preempted: should_stop() first (they do not poll it), SIGTERM after the loop's
wait, SIGKILL after the spec's ``preemption.grace_s``. One saves its step to
``TRAINHUB_CHECKPOINT_DIR`` on SIGTERM and resumes from exactly there; the other ignores SIGTERM,
is killed, and resumes from its last periodic checkpoint. Neither counts a restart
(``max_restarts: 0``: a failure would have ended them).
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

PLAIN = """\
import os, pathlib, signal, sys, time

state = pathlib.Path(os.environ["TRAINHUB_CHECKPOINT_DIR"]) / "step.txt"
step = int(state.read_text()) if state.exists() else 0
print(f"resumed from step {step}", flush=True)


def on_sigterm(signum, frame):
    if sys.argv[1] == "ignore":
        print("ignoring SIGTERM", flush=True)
        return
    state.write_text(str(step))
    print(f"saved step {step} on SIGTERM", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
while step < 60:
    time.sleep(0.5)
    step += 1
    if step % 10 == 0:
        state.write_text(str(step))
        print(f"checkpoint at step {step}", flush=True)
print("finished", flush=True)
"""


def spec(name: str, mode: str, cpus: int) -> str:
    return (
        f"name: {name}\nentrypoint: python train.py {mode}\n"
        f"resources: {{workers: 1, cpus_per_worker: {cpus}}}\n"
        "preemption: {grace_s: 3}\nmax_restarts: 0\n"
    )


def submit(plane: ControlPlaneProcess, tenant: str, text: str, context: Path) -> int:
    r = httpx.post(
        f"{plane.url}/api/v1/experiments",
        headers={"Authorization": f"Bearer {plane.token}"},
        data={"spec": text, "tenant": tenant},
        files={"context": ("context.tar.gz", pack_dir(context), "application/gzip")},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    return int(r.json()["trials"][0]["id"])


@pytest.fixture
def plane(ray_address: str, tmp_path: Path) -> Any:
    home = tmp_path / "home"
    home.mkdir()
    # preempt as soon as the guarantee asks, at any rate (a 6-slot cluster's reclaim budget
    # would otherwise hold a second reclaim for most of an hour); the loop's own waits are
    # the production ones
    settings = {"min_run_time_s": 1.0, "preemption_cooldown_s": 0.0, "reclaim_rate": 0.0}
    plane = ControlPlaneProcess(home, ray_address, settings=settings)
    plane.start()
    try:
        yield plane
    finally:
        for experiment in plane.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        plane.stop()


def test_plain_scripts_are_preempted_by_sigterm_and_resume(
    plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    for name, guaranteed in (("borrow", 0), ("owner", 6)):
        r = plane.request("POST", "/tenants", json={"name": name, "guaranteed_slots": guaranteed})
        assert r.status_code == 201, r.text
    code = tmp_path / "plain"
    code.mkdir()
    (code / "train.py").write_text(PLAIN)
    saver = submit(plane, "borrow", spec("saver", "save", 3), code)
    ignorer = submit(plane, "borrow", spec("ignorer", "ignore", 3), code)
    for trial_id in (saver, ignorer):
        plane.wait_for(
            trial_id,
            lambda t: t["state"] == "RUNNING",
            timeout_s=120,
            what="RUNNING",
        )
    deadline = time.monotonic() + 60
    while "checkpoint at step 10" not in plane.log(ignorer, 0, attempt=1):
        assert time.monotonic() < deadline, plane.log(ignorer, 0, attempt=1)
        time.sleep(0.5)

    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "train.py").write_text("import time\ntime.sleep(2)\n")
    owner = submit(plane, "owner", spec("owner", "run", 6), tmp_path / "owner")

    done = {}
    for trial_id in (owner, saver, ignorer):
        done[trial_id] = plane.wait_for(
            trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=240, what="COMPLETED"
        )
    for trial_id in (saver, ignorer):
        trial = done[trial_id]
        outcomes = [a["outcome"] for a in trial["attempts"]]
        # preempted (the saver may be again: it can backfill idle slots while the ignorer
        # still holds its grace period), then completed
        assert outcomes[-1] == "SUCCEEDED", trial
        assert len(outcomes) >= 2, trial
        assert set(outcomes[:-1]) == {"PREEMPTED"}, trial
        assert trial["num_restarts"] == 0
        kinds = [e["kind"] for e in trial["events"]]
        assert "preempting" in kinds
        assert "sigterm" in kinds  # should_stop() went unanswered: SIGTERM followed
    # the owner ran after the borrowers' first attempts were stopped
    first_owner_run = done[owner]["attempts"][0]["created_at"]
    for trial_id in (saver, ignorer):
        assert done[trial_id]["attempts"][0]["ended_at"] <= first_owner_run

    # the saver resumes from the step it saved on SIGTERM (attempts stopped while still being
    # placed never ran: they wrote nothing)
    logs = [plane.log(saver, 0, attempt=a["number"]) for a in done[saver]["attempts"]]
    ran = [text for text in logs if text]
    for before, after in itertools.pairwise(ran):
        # an attempt whose work ended while it was being stopped counts as preempted too (an
        # exit after should_stop() says nothing more); the next one resumes at the end
        match = re.search(r"saved step (\d+) on SIGTERM", before) or re.search(
            r"(?:checkpoint at|resumed from) step (60)\nfinished", before
        )
        assert match, (before, logs)
        assert f"resumed from step {match.group(1)}" in after, (after, logs)
    assert len(ran) >= 2

    # the ignorer is killed after the grace period and resumes from its last checkpoint
    ignored = plane.log(ignorer, 0, attempt=1)
    assert "ignoring SIGTERM" in ignored
    assert "finished" not in ignored
    last = max(int(s) for s in re.findall(r"checkpoint at step (\d+)", ignored))
    later = [plane.log(ignorer, 0, attempt=a["number"]) for a in done[ignorer]["attempts"][1:]]
    assert f"resumed from step {last}" in next(text for text in later if text)
