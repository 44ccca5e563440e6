"""The queue, trial priorities and usage accounting: the commands against a real server."""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import report, submit
from tests.fixtures.api import make_context
from trainhub.cli.main import app
from trainhub.core.resources import Node
from trainhub.core.states import TrialState
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial

HOUR = 3600.0


def cells(line: str) -> list[str]:
    """The cells of one row of a Rich table as printed."""
    return [c.strip() for c in line.split("│")]


def submit_as(live: LiveServer, token: str, name: str) -> int:
    r = live.api.client.post(
        "/api/v1/experiments",
        data={"spec": f"name: {name}\nproject: vision\nentrypoint: python train.py\n"},
        files={"context": ("c.tar.gz", make_context({"train.py": b""}), "application/gzip")},
        headers=live.api.headers(token),
    )
    assert r.status_code == 201, r.text
    return int(r.json()["trials"][0]["id"])


def ran(live: LiveServer, trial_id: int, start: float, end: float, slots: int) -> None:
    """An attempt of ``slots`` slots held from ``start`` to ``end`` (what usage counts)."""
    with live.api.services.uow() as repo:
        attempt = repo.add_attempt(
            trial_id, 1, f"attempt-{trial_id}-1", ("node-a",), None, None, start, num_slots=slots
        )
        repo.update_attempt(
            attempt.id, AttemptUpdate(started_at=start, ended_at=end, outcome="SUCCEEDED")
        )


def test_queue_lists_trials_in_order_with_reasons(cli: Cli, live: LiveServer) -> None:
    assert cli("queue").stdout.strip() == "the queue is empty"
    first = submit(live, "name: first\nentrypoint: python train.py\n")["trials"][0]["id"]
    second = submit(live, "name: second\nentrypoint: python train.py\n")["trials"][0]["id"]
    # the scheduler's last pass put the second one first
    report(
        live, second, queue_position=1, pending_reason="needs 4 GPUs on one node; largest free is 2"
    )
    report(live, first, queue_position=2, pending_reason="tenant quota of 8 GPUs in use")
    result = cli("queue")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "second" in line or "first" in line]
    assert len(lines) == 2
    assert "second" in lines[0]
    assert "largest free is 2" in lines[0]
    assert cells(lines[0])[:3] == ["1", str(second), f"exp {second} second"]
    assert "tenant quota of 8 GPUs in use" in lines[1]
    row = cells(lines[1])
    assert row[:6] == ["2", str(first), f"exp {first} first", "default", "admin", "normal"]
    assert row[6] in ("0s", "1s", "2s")  # waiting since it was submitted
    header = result.stdout.splitlines()[0]
    for column in ("#", "trial", "experiment", "tenant", "priority", "waiting", "pending reason"):
        assert column in header


def test_a_narrow_terminal_shows_each_reason_at_full_width(cli: Cli, live: LiveServer) -> None:
    """At 80 columns a table squeezes the reason into a column a dozen characters wide; the
    queue then shows each trial's facts on one line and its reason below them."""
    trial = submit(live, "name: narrow\nentrypoint: python train.py\n")["trials"][0]["id"]
    reason = (
        "next in line: 1 node(s) reserved (tenant default has received 99% of its guarantee "
        "recently, so it waits for GPUs that free on their own instead of preempting; it "
        "preempts when it nears 97%); waiting for resources: needs 2 worker(s) x 4 GPU"
    )
    report(live, trial, queue_position=1, pending_reason=reason)
    env = {"TRAINHUB_URL": cli.url, "TRAINHUB_TOKEN": cli.token or "", "COLUMNS": "80"}
    result = CliRunner().invoke(app, ["queue"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    head = next(i for i, line in enumerate(lines) if f"trial {trial} " in line)
    assert lines[head].split()[:3] == ["1", "trial", str(trial)]
    assert "narrow" in lines[head]
    assert "waiting" in lines[head]
    below = " ".join(line.strip() for line in lines[head + 1 :])
    assert below.startswith(reason)
    assert len(lines) - head - 1 <= 4  # the reason wraps at the full width, not in a column


def test_priority_changes_and_is_shown_in_the_queue(cli: Cli, live: LiveServer) -> None:
    trial_id = submit(live)["trials"][0]["id"]
    result = cli("priority", str(trial_id), "HIGH")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"trial {trial_id}: priority high, QUEUED"
    assert "high" in next(line for line in cli("queue").stdout.splitlines() if "demo" in line)
    assert cli("priority", str(trial_id), "urgent").exit_code == 0  # the admin may

    member = live.api.user("mia", "default")
    refused = cli("priority", str(trial_id), "urgent", token=member)
    assert refused.exit_code == 2
    assert "only cluster admins may set priority 'urgent'" in refused.stderr
    assert "hint: use 'high'" in refused.stderr
    assert "Traceback" not in refused.output

    bad = cli("priority", str(trial_id), "asap")
    assert bad.exit_code == 2  # not one of the levels: the CLI refuses it itself
    missing = cli("priority", "9999", "low")
    assert missing.exit_code == 2
    assert "trial 9999 does not exist" in missing.stderr
    with live.api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.CANCELED, ended_at=time.time()))
    ended = cli("priority", str(trial_id), "low")
    assert ended.exit_code == 2
    assert "already ended" in ended.stderr


def test_usage_tables_per_day_and_per_tenant(cli: Cli, live: LiveServer) -> None:
    live.api.client.post(
        "/api/v1/tenants",
        json={"name": "vision", "guaranteed_slots": 4},
        headers=live.api.headers(),
    )
    alice = live.api.user("alice", "vision")
    bob = live.api.user("bob", "default")
    a = submit_as(live, alice, "a")
    b = submit_as(live, bob, "b")
    now = time.time()
    ran(live, a, now - 3 * HOUR, now - 1 * HOUR, slots=2)  # 4 slot-hours
    ran(live, b, now - 0.5 * HOUR, now, slots=1)  # 0.5 slot-hours
    result = cli("usage", "--days", "1")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("usage ")
    assert "UTC (1d 00h)" in text.splitlines()[0]
    day_rows = [cells(line) for line in text.splitlines() if line.strip()[:2] == "20"]
    assert {(r[1], r[2], r[3]) for r in day_rows} == {
        ("vision", "alice", "vision"),
        ("default", "bob", "vision"),
    }
    assert sum(float(r[4]) for r in day_rows) == pytest.approx(4.5, abs=0.02)
    assert "total" in text
    # per tenant: vision used 4 slot-hours of a day: 0.17 slots on average, 4.2% of its 4
    share_lines = text.split("per tenant", 1)[1].splitlines()
    vision = next(cells(line) for line in share_lines if line.strip().startswith("vision"))
    assert vision[1:5] == ["4", "4.00", "0.17", "4.2%"]
    # guarantee kept: received over entitled slot-time (the attempts above were written into
    # the past, before the trial's submission, so it received nothing while it demanded)
    assert vision[5].endswith("%")
    default = next(cells(line) for line in share_lines if line.strip().startswith("default"))
    assert default[1:] == ["0", "0.50", "0.02", "-", "-"]  # no guarantee: entitled to nothing

    # a member sees only their own tenants
    mine = cli("usage", "--days", "1", token=alice).stdout
    assert "vision" in mine
    assert "default" not in mine


def test_usage_csv_and_periods(cli: Cli, live: LiveServer) -> None:
    bob = live.api.user("bob", "default")
    trial = submit_as(live, bob, "b")
    start = datetime(2024, 5, 1, 22, tzinfo=UTC).timestamp()
    ran(live, trial, start, start + 4 * HOUR, slots=2)  # crosses UTC midnight
    result = cli("usage", "--since", "2024-05-01", "--until", "2024-05-03", "--csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [
        [
            "day",
            "tenant",
            "user",
            "project",
            "slot_hours",
            "inter_node_sent_bytes",
            "inter_node_received_bytes",
            "intra_node_bytes",
        ],
        ["2024-05-01", "default", "bob", "vision", "4.0000", "0", "0", "0"],
        ["2024-05-02", "default", "bob", "vision", "4.0000", "0", "0", "0"],
    ]
    table = cli("usage", "--since", "2024-05-02T00:00", "--until", "2024-05-03").stdout
    assert "usage 2024-05-02 00:00 to 2024-05-03 00:00 UTC (1d 00h)" in table
    assert "2024-05-01" not in table
    empty = cli("usage", "--since", "2023-01-01", "--until", "2023-01-02")
    assert "no slots were allocated in this period" in empty.stdout
    assert "default" in empty.stdout  # every tenant still gets its share row

    both = cli("usage", "--since", "2024-05-01", "--days", "3")
    assert both.exit_code == 2
    assert "not both" in both.stderr
    bad = cli("usage", "--since", "last tuesday")
    assert bad.exit_code == 2
    assert "is not a date" in bad.stderr
    backwards = cli("usage", "--since", "2024-05-03", "--until", "2024-05-01")
    assert backwards.exit_code == 2


def test_server_maps_scheduling_options_onto_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainhub.server

    seen: list[trainhub.server.Settings] = []
    monkeypatch.setattr(trainhub.server, "serve", seen.append)
    args = ["server", "--home", str(tmp_path), "--policy", "FAIR", "--min-run-time-s", "1"]
    args += ["--preemption-cooldown-s", "0", "--usage-half-life-s", "60"]
    args += ["--reclaim-patience", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.policy == "fair"
    assert settings.min_run_time_s == 1.0
    assert settings.preemption_cooldown_s == 0.0
    assert settings.usage_half_life_s == 60.0
    policy = trainhub.server.make_policy(settings)
    assert policy.__class__.__name__ == "FairSharePolicy"
    assert policy.standing_half_life_s is None  # no patience: no ledger kept

    seen.clear()
    env = {"TRAINHUB_POLICY": "sjf"}
    assert CliRunner().invoke(app, ["server", "--home", str(tmp_path)], env=env).exit_code == 0
    defaults = trainhub.server.Settings()
    assert seen[0].policy == "sjf"
    assert seen[0].min_run_time_s == defaults.min_run_time_s
    assert seen[0].preemption_cooldown_s == defaults.preemption_cooldown_s
    assert seen[0].usage_half_life_s == defaults.usage_half_life_s

    refused = CliRunner().invoke(app, ["server", "--policy", "random"])
    assert refused.exit_code == 2
    assert not seen[1:]


def test_queue_says_when_guarantees_exceed_the_cluster(cli: Cli, live: LiveServer) -> None:
    # the live server's cluster: one node of 4 GPUs; the default tenant is guaranteed 6
    live.api.services.experiments.cluster_nodes = lambda: [
        Node("node-a", total_gpus=4, total_cpus=8.0, free_gpus=4, free_cpus=8.0)
    ]
    assert "note:" not in cli("queue").stdout
    r = live.api.client.patch(
        "/api/v1/tenants/default", json={"guaranteed_slots": 6}, headers=live.api.headers()
    )
    assert r.status_code == 200
    result = cli("queue")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "note: tenant guarantees add up to 6 GPUs, more than the cluster's 4" in text
    assert "scaled down by 0.67" in text
    assert "the queue is empty" in text
