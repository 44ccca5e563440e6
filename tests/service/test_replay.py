"""``trainhub sim --replay``: a database filled through the API, then re-run by the simulator.

The API takes the submissions (users, tenants, experiments over HTTP); the control loop runs
them on a fake executor with a stepped clock, under FIFO, on one node of 4 CPU slots. Replayed
under FIFO on the same cluster, the recorded arrivals and run times give back exactly what
happened; on a bigger cluster, jobs finish sooner.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.api.app import create_app
from trainhub.cli.main import app as cli_app
from trainhub.core.scheduling import FifoPolicy
from trainhub.service.container import Services
from trainhub.service.tracking import TrackingService
from trainhub.service.usage import UsageService

# (submitted at, user, workers, seconds it runs)
WORKLOAD = [
    (0.0, "alice", 1, 600.0),
    (10.0, "bob", 2, 300.0),
    (20.0, "alice", 1, 900.0),
    (400.0, "bob", 1, 200.0),
    (1000.0, "alice", 2, 100.0),
]


@dataclass
class Filled:
    url: str
    jcts: dict[int, float]  # what really happened: trial id -> completion time


def fill_through_the_api(h: LoopHarness) -> dict[int, float]:
    services = Services(
        uow=h.uow,
        clock=h.clock,
        experiments=h.experiments,
        tracking=TrackingService(h.uow, h.store, h.clock),
        admin=h.admin,
        usage=UsageService(h.uow, h.clock),
        cluster_nodes=h.executor.cluster_nodes,
    )
    admin = {"Authorization": f"Bearer {h.admin_secret}"}
    start = h.clock()
    tokens: dict[str, str] = {}
    submitted: dict[int, float] = {}
    ends: dict[int, float] = {}
    with TestClient(create_app(services)) as client:
        for user, tenant in (("alice", "vision"), ("bob", "speech")):
            assert client.post("/api/v1/tenants", json={"name": tenant}, headers=admin).is_success
            r = client.patch(
                f"/api/v1/tenants/{tenant}", json={"guaranteed_slots": 2}, headers=admin
            )
            assert r.is_success, r.text
            assert client.post("/api/v1/users", json={"username": user}, headers=admin).is_success
            r = client.put(
                f"/api/v1/users/{user}/memberships",
                json={"tenant": tenant, "role": "member"},
                headers=admin,
            )
            assert r.is_success, r.text
            r = client.post("/api/v1/tokens", json={"username": user}, headers=admin)
            tokens[user] = r.json()["token"]
        arrivals = list(WORKLOAD)
        durations: dict[int, float] = {}
        finishing: dict[int, float] = {}
        while arrivals or finishing:
            now = min([start + a[0] for a in arrivals[:1]] + list(finishing.values()))
            h.clock.now = now
            while arrivals and start + arrivals[0][0] <= now:
                _, user, workers, seconds = arrivals.pop(0)
                spec = (
                    f"name: job\nentrypoint: sleep 1\nproject: p-{user}\n"
                    f"resources: {{workers: {workers}, cpus_per_worker: 2}}\n"
                )
                r = client.post(
                    "/api/v1/experiments",
                    data={"spec": spec},
                    headers={"Authorization": f"Bearer {tokens[user]}"},
                )
                assert r.status_code == 201, r.text
                trial_id = r.json()["trials"][0]["id"]
                durations[trial_id] = seconds
                submitted[trial_id] = now
            for trial_id, at in list(finishing.items()):
                if at <= now:
                    key = h.key(trial_id)
                    h.executor.exit(key, [0] * len(h.executor.attempts[key].ranks))
                    del finishing[trial_id]
                    ends[trial_id] = now
            report = h.tick()
            for trial_id in report.started:
                h.executor.run(h.key(trial_id))
                finishing[trial_id] = now + durations[trial_id]
            if report.started:
                h.tick()  # seen running at once: the recorded run time is the whole stay
    return {t: ends[t] - submitted[t] for t in ends}


@pytest.fixture
def filled(db_url: str, tmp_path: Path) -> Filled:
    h = LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(1, cpus=4), db_url=db_url)
    try:
        jcts = fill_through_the_api(h)
    finally:
        h.close()
    return Filled(db_url, jcts)


def _no_nan(constant: str) -> None:
    raise AssertionError(f"{constant} in a JSON line: not JSON (jq and browsers refuse it)")


def run_sim(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = CliRunner().invoke(cli_app, ["sim", *args])
    lines = [
        json.loads(line, parse_constant=_no_nan)
        for line in result.stdout.splitlines()
        if line.startswith("{")
    ]
    return result.exit_code, lines, result.stdout


def test_a_replay_under_the_same_policy_gives_back_what_happened(filled: Filled) -> None:
    assert len(filled.jcts) == len(WORKLOAD)
    code, lines, out = run_sim(
        "--replay", filled.url, "--nodes", "1", "--gpus-per-node", "4", "-p", "fifo", "--json"
    )
    assert code == 0, out
    actual, fifo = lines
    assert actual["policy"] == "actual"
    assert fifo["policy"] == "fifo"
    assert actual["jobs"] == actual["completed"] == len(WORKLOAD)
    expected = sum(filled.jcts.values()) / len(filled.jcts)
    assert actual["avg_jct_s"] == pytest.approx(expected)
    for key in ("avg_jct_s", "p99_jct_s", "avg_queueing_s", "makespan_s", "utilisation"):
        assert fifo[key] == pytest.approx(actual[key]), key
    # what really happened, against the guarantees recorded in the database
    ratios = actual["tenant_ratios"]
    assert isinstance(ratios, dict)
    assert set(ratios) >= {"vision", "speech"}


def test_a_replay_answers_what_if(filled: Filled) -> None:
    code, lines, out = run_sim(
        "--replay",
        filled.url,
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "-p",
        "fifo",
        "-p",
        "fair",
        "--guarantee",
        "vision=4",
        "--json",
    )
    assert code == 0, out
    actual, fifo, fair = lines
    assert fifo["avg_jct_s"] < actual["avg_jct_s"]  # twice the cluster: less waiting
    assert fair["policy"] == "fair"
    assert fair["completed"] == len(WORKLOAD)


def test_a_replay_of_an_empty_database_says_so(sqlite_url: str, tmp_path: Path) -> None:
    LoopHarness(tmp_path, FifoPolicy(), cpu_nodes(1), db_url=sqlite_url).close()
    code, _, out = run_sim("--replay", sqlite_url.removeprefix("sqlite:///"), "-p", "fifo")
    assert code == 2
    assert "holds no trial that ran and ended" in " ".join(out.split())
    code, _, out = run_sim("--replay", sqlite_url, "--guarantee", "vision:8")
    assert code == 2
    assert "TENANT=SLOTS" in out


def test_a_replay_of_what_is_no_trainhub_database_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    code, _, out = run_sim("--replay", str(missing))
    assert code == 2
    assert "there is no database file at" in " ".join(out.split())
    assert not missing.exists()  # SQLite did not make an empty one
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a database\n" * 100)
    code, _, out = run_sim("--replay", str(garbage))
    assert code == 2
    assert "cannot open the database" in " ".join(out.split())
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE trials (id INTEGER)").connection.commit()
    code, _, out = run_sim("--replay", str(other))
    assert code == 2
    assert "is not a trainhub database" in " ".join(out.split())
