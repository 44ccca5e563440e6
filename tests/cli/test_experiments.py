"""ls, show, cancel, logs and metrics against a real server."""

from __future__ import annotations

import time

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import TIMING, finish, report, start, submit
from trainhub.core.resources import Node
from trainhub.service.keys import log_key
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial


def test_ls_lists_experiments_newest_first_and_filters_by_state(cli: Cli, live: LiveServer) -> None:
    assert cli("ls").stdout.strip() == "no experiments"
    submit(live)
    submit(live, "name: second\nentrypoint: python train.py\n")
    result = cli("ls")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "default" in line]
    assert "second" in lines[0]
    assert "demo" in lines[1]
    assert "admin" in lines[0]
    assert "ACTIVE" in lines[0]
    assert "ago" in lines[0]
    for header in ("exp", "name", "tenant", "owner", "state", "trials", "created"):
        assert header in result.stdout
    assert cli("ls", "--state", "completed").stdout.strip() == "no experiments in state COMPLETED"
    limited = cli("ls", "--limit", "1")
    assert "second" in limited.stdout
    assert "demo" not in limited.stdout
    assert "showing 1 of 2" in limited.stderr
    assert cli("ls", "--state", "bogus").exit_code == 2


def test_show_an_experiment_with_one_trial_shows_the_trial(cli: Cli, live: LiveServer) -> None:
    exp = submit(live)
    result = cli("show", str(exp["id"]))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "demo" in out
    assert "ACTIVE" in out
    assert "python train.py" in out
    assert "trial 1 (demo) QUEUED" in out
    assert "pending" in out
    assert "waiting for the scheduler" in out
    assert "lr=0.01" in out
    assert "submitted by admin" in out  # recent events


def test_show_a_running_trial_with_metrics_timings_attempts_checkpoints(
    cli: Cli, live: LiveServer
) -> None:
    exp = submit(live)
    trial_id = exp["trial_ids"][0]
    start(live, trial_id)
    report(
        live,
        trial_id,
        progress={"current": 30, "total": 100, "unit": "epochs"},
        latest_metrics={"step": 30, "val_accuracy": 0.91, **TIMING},
    )
    with live.api.services.uow() as repo:
        repo.add_checkpoint(trial_id, "c-1", 20, 1, {"val_accuracy": 0.9}, "k", 2_500_000, 0.0)
    result = cli("show", "--trial", str(trial_id))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "RUNNING" in out
    assert "30/100 epochs (30%)" in out
    assert "latest metrics (step 30)" in out
    assert "val_accuracy" in out
    assert "0.91" in out
    where = out[out.index("where the time goes") :]
    assert "backward" in where
    assert "50.0% (100.0 ms)" in where
    assert "2.1 MB" in where
    assert "throughput/samples_per_s" in where
    # profiling metrics are not repeated among the training metrics
    assert "time/" not in out[out.index("latest metrics") : out.index("where the time goes")]
    assert "attempts" in out
    assert "node-a x2" in out
    assert "running" in out
    assert "checkpoints" in out
    assert "2.5 MB" in out
    assert "val_accuracy=0.9" in out


def test_show_a_failed_attempt_with_exit_codes_and_detail(cli: Cli, live: LiveServer) -> None:
    from trainhub.core.states import TrialState

    trial_id = submit(live)["trial_ids"][0]
    attempt = start(live, trial_id)
    finish(live, trial_id, attempt, TrialState.FAILED, "a rank failed and no restarts were left")
    out = cli("show", "--trial", str(trial_id)).stdout
    assert "FAILED" in out
    assert "0,3" in out
    assert "rank 1 exited with 3" in out
    assert "no restarts were left" in out


def test_show_unknown_ids_are_readable_errors(cli: Cli, live: LiveServer) -> None:
    result = cli("show", "999")
    assert result.exit_code == 2
    assert "error:" in result.stderr
    assert "999" in result.stderr
    assert cli("show", "--trial", "999").exit_code == 2


def test_cancel_an_experiment_and_a_trial(cli: Cli, live: LiveServer) -> None:
    first = submit(live)
    result = cli("cancel", str(first["id"]))
    assert result.exit_code == 0, result.output
    assert f"exp {first['id']} (demo): CANCELED" in result.stdout
    assert "trial 1: CANCELED" in result.stdout
    second = submit(live)
    trial_id = second["trial_ids"][0]
    start(live, trial_id)
    result = cli("cancel", "--trial", str(trial_id))
    assert result.exit_code == 0, result.output
    assert f"trial {trial_id}:" in result.stdout
    assert "CANCELED" in cli("ls", "--state", "canceled").stdout


def test_logs_of_a_trial_with_no_attempts(cli: Cli, live: LiveServer) -> None:
    trial_id = submit(live)["trial_ids"][0]
    result = cli("logs", f"trial/{trial_id}")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert f"trial {trial_id} has no attempts yet: it is QUEUED" in result.stderr
    assert f"trainhub logs trial/{trial_id} -f" in result.stderr
    cli("cancel", "--trial", str(trial_id))
    result = cli(
        "logs", f"trial/{trial_id}", "-f"
    )  # ended without running: following stops at once
    assert result.exit_code == 0
    assert "ended (CANCELED) without running" in result.stderr


def test_logs_print_raw_text_and_follow_stops_when_the_attempt_ended(
    cli: Cli, live: LiveServer
) -> None:
    trial_id = submit(live)["trial_ids"][0]
    attempt = start(live, trial_id)
    text = "epoch 1 [red]not markup[/red]\n" + "x" * 300_000 + "\nlast line\n"
    live.api.store.write_at(log_key("default", trial_id, 1, 1), 0, text.encode())
    result = cli("logs", f"trial/{trial_id}", "--rank", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout == text  # several chunks, no markup interpreted
    assert (
        cli("logs", f"trial/{trial_id}").stderr.strip()
        == "attempt 1, rank 0 has written no output yet"
    )
    finish(live, trial_id, attempt)
    assert cli("logs", f"trial/{trial_id}").stderr.strip() == "attempt 1, rank 0 wrote no output"
    result = cli("logs", f"trial/{trial_id}", "--rank", "1", "-f", "--poll-interval-s", "0.01")
    assert result.exit_code == 0
    assert result.stdout == text
    bad = cli("logs", f"trial/{trial_id}", "--rank", "7")
    assert bad.exit_code == 2
    assert "rank 7 does not exist" in bad.stderr


def test_logs_follow_moves_on_to_the_next_attempt(cli: Cli, live: LiveServer) -> None:
    from trainhub.core.states import TrialState

    trial_id = submit(live)["trial_ids"][0]
    first = start(live, trial_id)
    live.api.store.write_at(log_key("default", trial_id, 1, 0), 0, b"first attempt\n")
    now = time.time()
    with live.api.services.uow() as repo:
        repo.update_attempt(first, AttemptUpdate(outcome="LOST", ended_at=now))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.QUEUED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING))
        second = repo.add_attempt(trial_id, 2, "a2", ["node-b"], None, None, now)
        repo.update_attempt(
            second.id, AttemptUpdate(outcome="SUCCEEDED", exit_codes=(0,), ended_at=now)
        )
        write_trial(
            repo, trial_id, TrialUpdate(state=TrialState.COMPLETED, ended_at=now, num_attempts=2)
        )
    live.api.store.write_at(log_key("default", trial_id, 2, 0), 0, b"second attempt\n")
    result = cli("logs", f"trial/{trial_id}", "-f", "--attempt", "1", "--poll-interval-s", "0.01")
    assert result.stdout == "first attempt\n"
    assert cli("logs", f"trial/{trial_id}").stdout == "second attempt\n"  # default: the latest
    from trainhub.client import TrainhubClient

    with TrainhubClient(live.url, live.api.admin_token) as client:
        chunks = list(client.iter_logs(trial_id, follow=True, poll_interval_s=0.01))
    # unpinned following starts at the latest attempt and ends with the trial
    assert [c["text"] for c in chunks] == ["second attempt\n"]


def test_metrics_table_and_csv(cli: Cli, live: LiveServer) -> None:
    trial_id = submit(live)["trial_ids"][0]
    assert "has reported no metrics yet" in cli("metrics", f"trial/{trial_id}").stderr
    start(live, trial_id)
    with live.api.services.uow() as repo:
        repo.upsert_metrics(
            trial_id, 1, [(0, {"loss": 1.0}), (1, {"loss": 0.5, "acc": 0.75})], time.time()
        )
    table = cli("metrics", f"trial/{trial_id}").stdout
    assert "loss" in table
    assert "acc" in table
    assert "0.75" in table
    rows = cli("metrics", f"trial/{trial_id}", "--csv").stdout.splitlines()
    assert rows[0] == "step,attempt,reported_at,acc,loss"
    assert rows[1].startswith("0,1,")
    assert rows[1].endswith(",,1.0")
    assert rows[2].endswith(",0.75,0.5")
    only = cli("metrics", f"trial/{trial_id}", "--csv", "--keys", "loss").stdout.splitlines()
    assert only[0] == "step,attempt,reported_at,loss"
    assert len(only) == 3
    # the runtime's own metrics (step timing, communication) only on asking in the table
    with live.api.services.uow() as repo:
        repo.upsert_metrics(trial_id, 1, [(2, {"loss": 0.25, "time/step_s": 0.2})], time.time())
    plain = cli("metrics", f"trial/{trial_id}")
    assert "time/step_s" not in plain.stdout
    assert "1 metric of the runtime not shown" in plain.stderr
    assert "time/step_s" in cli("metrics", f"trial/{trial_id}", "--all").stdout
    assert "time/step_s" in cli("metrics", f"trial/{trial_id}", "--csv").stdout.splitlines()[0]


def test_metrics_keep_the_scripts_epochs_apart_from_ctx_watch_batches(
    cli: Cli, live: LiveServer
) -> None:
    from rich.console import Console

    from trainhub.cli.follow import final_view
    from trainhub.service.records import TrialUpdate

    trial_id = submit(live)["trial_ids"][0]
    start(live, trial_id)
    epochs = [(e, {"val_accuracy": 0.5 + e / 10}) for e in range(3)]
    batches = [(b, {"layers/fc1/grad_norm": 0.1 * b}) for b in range(0, 340, 20)]
    with live.api.services.uow() as repo:
        repo.upsert_metrics(trial_id, 1, [*epochs, *batches], time.time())
    table = cli("metrics", f"trial/{trial_id}").stdout
    rows = [line for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3  # the script's epochs only: no empty rows for ctx.watch's batches
    assert "layers/" not in table
    assert "layers/fc1/grad_norm" in cli("metrics", f"trial/{trial_id}", "--all").stdout
    # --follow's final metrics: the script's own, at their own last step
    with live.api.services.uow() as repo:
        latest = {"val_accuracy": 0.7, "layers/fc1/grad_norm": 32.0, "step": 320}
        repo.update_trial(trial_id, TrialUpdate(latest_metrics=latest))
    shown = live.api.client.get(f"/api/v1/trials/{trial_id}", headers=live.api.headers()).json()
    points = live.api.client.get(
        f"/api/v1/trials/{trial_id}/metrics", headers=live.api.headers()
    ).json()["data"]
    console = Console(record=True, width=100)
    console.print(final_view(shown, points))
    text = console.export_text()
    assert "final metrics (step 2)" in text
    assert "val_accuracy" in text
    assert "layers/" not in text
    assert "step 320" not in text


def test_cluster_nodes(cli: Cli, live: LiveServer) -> None:
    assert "no nodes" in cli("cluster").stdout
    live.api.services.cluster_nodes = lambda: [
        Node("node-1", 8, 64.0, 8, 64.0, {"zone": "a"}, "A100"),
        Node("node-2", 0, 16.0, 0, 16.0, alive=False),
    ]
    out = cli("cluster").stdout
    assert "node-1" in out
    assert "A100" in out
    assert "zone=a" in out
    assert "1/2 nodes alive, 8 GPUs, 80 CPUs" in out


def test_ls_sorts_by_best_and_filters_by_user_and_tenant(cli: Cli, live: LiveServer) -> None:
    from tests.api.test_experiment_list import _report, _spec

    for name, value in (("low", 0.2), ("top", 0.8), ("none", None)):
        exp = submit(live, _spec(name))
        if value is not None:
            _report(live.api, exp["trial_ids"][0], [value])
    result = cli("ls", "--sort", "best")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "default" in line]
    assert [_name_in(r) for r in rows] == ["top", "low", "none"]
    assert "best" in result.stdout
    assert "0.8" in rows[0]
    asc = cli("ls", "--sort", "best", "--order", "asc").stdout
    assert [_name_in(r) for r in asc.splitlines() if "default" in r] == ["low", "top", "none"]
    assert "top" in cli("ls", "--user", "admin", "--tenant", "default").stdout
    assert cli("ls", "--user", "nobody").stdout.strip() == "no experiments"
    assert cli("ls", "--tenant", "elsewhere").stdout.strip() == "no experiments"
    assert cli("ls", "--sort", "loss").exit_code == 2
    assert cli("ls", "--user", "u" * 65).exit_code == 2


def _name_in(row: str) -> str:
    return next(n for n in ("top", "low", "none") if f" {n} " in row)


def test_show_a_trial_lists_the_limits_of_its_ranks(cli: Cli, live: LiveServer) -> None:
    from trainhub.core.isolation import NodeIsolation

    spec = (
        "name: limited\nentrypoint: python train.py\n"
        "resources: {cpus_per_worker: 0.5, memory_gb_per_worker: 1}\n"
    )
    trial_id = submit(live, spec)["trial_ids"][0]
    unsandboxed = cli("show", "--trial", str(trial_id)).stdout
    assert "sandbox: none" in unsandboxed
    live.api.services.experiments.isolation = NodeIsolation(pids_per_rank=256)
    out = cli("show", "--trial", str(trial_id)).stdout
    assert "limits (per rank)" in out
    assert "memory: 1 GiB, no swap" in out
    assert "cpu: 0.5 CPU" in out
    assert "processes: 256" in out
    assert "/dev/shm: 0.5 GiB" in out
    assert "network: trial" in out
