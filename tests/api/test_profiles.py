"""`trainhub profile` end to end without Ray: a real uvicorn, two ranks' RankProfiler with real
torch.profiler and the trial's token, the CLI waiting for both and saving their traces."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.api.conftest import Served
from tests.api.test_auth import submit
from tests.api.trials import end_trial, start_attempt
from tests.cli.conftest import Cli
from trainhub.core.states import TrialState
from trainhub.runtime.profiling import RankProfiler
from trainhub.runtime.transport import ControlPlaneClient
from trainhub.service.auth import new_token
from trainhub.service.records import TrialUpdate
from trainhub.service.trial_writes import write_trial


def _two_ranks(served: Served, token: str) -> tuple[int, str]:
    """A running trial with a 2-rank attempt; its trial token."""
    api = served.api
    trial_id = submit(api, token).json()["trials"][0]["id"]
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        row = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=1.0))
        repo.add_attempt(trial_id, 1, f"t{trial_id}-a1", ["node-a", "node-b"], None, row.id, 1.0)
    return trial_id, secret


def _train(profilers: list[RankProfiler], until_s: float) -> None:
    """A small model's steps, a rank's profiler told at every step's end. Ranks are processes
    of their own in a trial; here, in one process, they take turns (torch.profiler runs one
    session per process)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline and not all(p.results for p in profilers):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        next(p for p in profilers if not p.results).step()
        time.sleep(0.01)


def test_profile_a_running_trial_on_every_rank(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = served.api
    alice = api.user("alice", "vision")
    trial_id, trial_secret = _two_ranks(served, alice)

    def client() -> ControlPlaneClient:
        return ControlPlaneClient(served.url, trial_secret, trial_id, 10.0)

    ranks = [RankProfiler(client, rank, poll_s=0.05) for rank in (0, 1)]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cli = Cli(served.url, alice)
    answer: dict[str, Any] = {}
    command = threading.Thread(
        target=lambda: answer.update(
            result=cli(
                "profile",
                f"trial/{trial_id}",
                "--steps",
                "5",
                "--wait",
                "60",
                "--out",
                str(tmp_path),
            )
        )
    )
    command.start()
    try:
        _train(ranks, until_s=60)
    finally:
        command.join(70)
        for rank in ranks:
            rank.close()
    result = answer["result"]
    assert result.exit_code == 0, result.output
    assert "rank 0: top operators by self time" in result.output
    assert "rank 1: top operators by self time" in result.output
    assert "aten::" in result.output  # torch's operators, e.g. aten::addmm
    for rank in (0, 1):
        traces = list(tmp_path.glob(f"trial{trial_id}-profile*-rank{rank}.trace.json.gz"))
        assert len(traces) == 1
        trace = json.loads(gzip.decompress(traces[0].read_bytes()))
        assert trace["traceEvents"], "a Chrome trace with events (opens in Perfetto)"
    assert all(len(r.results) == 1 for r in ranks)  # each rank profiled once

    profile_id = ranks[0].results[0]["profile_id"]
    shown = api.client.get(
        f"/api/v1/trials/{trial_id}/profiles/{profile_id}", headers=api.headers(alice)
    ).json()
    assert shown["state"] == "DONE"
    assert [r["rank"] for r in shown["ranks"]] == [0, 1]
    assert shown["ranks"][0]["top_ops"][0]["self_cpu_ms"] > 0


def test_profile_requests_are_checked(served: Served) -> None:
    api = served.api
    alice = api.user("alice", "vision")
    trial_id, trial_secret = _two_ranks(served, alice)
    path = f"/api/v1/trials/{trial_id}/profiles"
    assert api.client.post(path, json={"steps": 0}, headers=api.headers(alice)).status_code == 422
    first = api.client.post(path, json={"steps": 3}, headers=api.headers(alice))
    assert first.status_code == 201, first.text
    again = api.client.post(path, json={"steps": 3}, headers=api.headers(alice))
    assert again.status_code == 409
    assert "still REQUESTED" in again.json()["message"]
    profile_id = first.json()["id"]
    # the runtime sees it; a user cannot upload in its place; a viewer elsewhere sees nothing
    pending = api.client.get(f"{path}/pending", headers=api.headers(trial_secret)).json()
    assert pending["profile"]["id"] == profile_id
    table = {"top_ops": [{"name": "aten::mm", "calls": 3, "self_cpu_ms": 1.5}]}
    forged = api.client.post(f"{path}/{profile_id}/ranks/0", json=table, headers=api.headers(alice))
    assert forged.status_code == 403
    outsider = api.user("bob", "audio", role="viewer")
    assert api.client.get(f"{path}/{profile_id}", headers=api.headers(outsider)).status_code == 404
    bad_rank = api.client.post(
        f"{path}/{profile_id}/ranks/5", json=table, headers=api.headers(trial_secret)
    )
    assert bad_rank.status_code == 400
    ok = api.client.post(
        f"{path}/{profile_id}/ranks/0", json=table, headers=api.headers(trial_secret)
    )
    assert ok.json()["state"] == "RUNNING"
    # the trial ends before rank 1 answered: the profile is given up, with the reason
    end_trial(api, trial_id)
    gone = api.client.get(f"{path}/{profile_id}", headers=api.headers(alice)).json()
    assert gone["state"] == "FAILED"
    assert "stopped running" in gone["detail"]
    ended = api.client.post(path, json={"steps": 3}, headers=api.headers(alice))
    assert ended.status_code == 409
    assert "only a running trial" in ended.json()["message"]


TRAIN = """
import time, torch, trainhub
ctx = trainhub.init()
model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
deadline = time.monotonic() + 40
while time.monotonic() < deadline:
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    ctx.profile_step()
    time.sleep(0.01)
"""


def test_a_training_process_answers_through_context_profile_step(
    served: Served, tmp_path: Path
) -> None:
    """The hook a script calls, in a process of its own with the executor's environment."""
    import os
    import subprocess
    import sys

    api = served.api
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    runtime_headers = start_attempt(api, trial_id)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {
        **os.environ,
        "TRAINHUB_API_URL": served.url,
        "TRAINHUB_TOKEN": runtime_headers["Authorization"].split()[1],
        "TRAINHUB_TRIAL_ID": str(trial_id),
        "TRAINHUB_PROFILE_POLL_S": "0.2",
        "TRAINHUB_SPOOL_DIR": str(tmp_path / "spool"),
    }
    process = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
    try:
        path = f"/api/v1/trials/{trial_id}/profiles"
        r = api.client.post(path, json={"steps": 4}, headers=api.headers(alice))
        assert r.status_code == 201, r.text
        profile_id = r.json()["id"]
        deadline = time.monotonic() + 40
        shown: dict[str, Any] = {}
        while time.monotonic() < deadline:
            shown = api.client.get(f"{path}/{profile_id}", headers=api.headers(alice)).json()
            if shown["state"] == "DONE":
                break
            assert process.poll() is None, "the training process exited"
            time.sleep(0.3)
        assert shown["state"] == "DONE", shown
        names = [op["name"] for op in shown["ranks"][0]["top_ops"]]
        assert any(n.startswith("aten::") for n in names), names
    finally:
        process.kill()
        process.wait(10)


def test_the_cli_says_a_script_without_profile_step_never_starts_a_profile(
    served: Served, tmp_path: Path
) -> None:
    alice = served.api.user("alice", "vision")
    trial_id, _ = _two_ranks(served, alice)
    cli = Cli(served.url, alice)
    too_many = cli("profile", f"trial/{trial_id}", "--steps", "100000")
    assert too_many.exit_code == 2, too_many.output
    a_file = tmp_path / "trace"
    a_file.write_text("")
    to_file = cli("profile", f"trial/{trial_id}", "--out", str(a_file))
    assert to_file.exit_code == 2, to_file.output
    assert "is a file" in to_file.output
    waited = cli("profile", f"trial/{trial_id}", "--steps", "2", "--wait", "0")
    assert waited.exit_code == 1, waited.output
    assert "must call ctx.profile_step() once per training step" in waited.output
