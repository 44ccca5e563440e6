"""The federation's processes without a control plane: trainhub's Flower server (standalone:
metrics to a local file, checkpoints to a local folder) and two supervised clients, each with
the partition its node would materialise, as real processes on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from trainhub.adapters.federated_partition import materialise
from trainhub.core import federated_spec, verdicts
from trainhub.runtime import federated
from trainhub.runtime.federated import __main__ as runner

EXAMPLE = Path(__file__).parents[2] / "examples" / "federated"


def test_the_runtime_names_are_the_cores() -> None:
    assert federated.FEDERATED_ENV == federated_spec.FEDERATED_ENV
    assert federated.PARTITION_ENV == federated_spec.PARTITION_ENV
    assert runner.EXIT_CLIENT_NEVER_JOINED == verdicts.EXIT_CLIENT_NEVER_JOINED


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_and_two_clients_run_rounds_and_resume(tmp_path: Path) -> None:
    section = {
        "clients": 2,
        "rounds": 2,
        "strategy": "fedadam",
        "min_available_clients": 2,
        "partition": {"dataset": "digits", "scheme": "dirichlet", "alpha": 0.5, "seed": 0},
    }
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TRAINHUB_", "RANK"))},
        "MASTER_ADDR": "127.0.0.1",
        "TRAINHUB_HPARAMS": json.dumps({"lr": 0.05, "local_epochs": 1, "max_batches": 2}),
    }
    folders = []
    for client in range(2):
        folder = tmp_path / f"partition{client}"
        materialise(section, client, None, folder)
        folders.append(folder)
    shares = [np.load(f / "indices.npy") for f in folders]
    assert not set(shares[0].tolist()) & set(shares[1].tolist())

    def federation(rounds: int) -> tuple[str, list[str]]:
        env = {
            **base,
            "MASTER_PORT": str(_port()),
            "TRAINHUB_FEDERATED": json.dumps({**section, "rounds": rounds}),
        }
        argv = [sys.executable, "-m", "trainhub.runtime.federated", sys.executable, "client.py"]
        server = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env={**env, "RANK": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        clients = [
            subprocess.Popen(
                argv,
                cwd=EXAMPLE,
                env={**env, "RANK": str(k + 1), "TRAINHUB_FEDERATED_PARTITION": str(f)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for k, f in enumerate(folders)
        ]
        # minutes, not seconds, where the machine is loaded (torch imports in three processes)
        out = server.communicate(timeout=420)[0].decode(errors="replace")
        logs = [c.communicate(timeout=120)[0].decode(errors="replace") for c in clients]
        assert server.returncode == 0, out
        assert [c.returncode for c in clients] == [0, 0], logs
        return out, logs

    out, _ = federation(rounds=1)
    assert "federation ready: 2 clients connected" in out
    assert "round 1: 2 clients trained" in out
    lines = [json.loads(x) for x in (tmp_path / "trainhub-metrics.jsonl").read_text().splitlines()]
    # two reports of round 1: its metrics before its checkpoint, its timing after it
    assert [line["step"] for line in lines] == [1, 1]
    assert "val_loss" in lines[0], lines[0]
    assert "checkpoint_s" not in lines[0], lines[0]
    assert "checkpoint_s" in lines[1], lines[1]
    values = {**lines[0], **lines[1]}
    assert values["clients_fit"] == 2
    assert values["clients_failed"] == 0
    assert values["client1/bytes_sent"] > 0
    assert values["client0/bytes_received"] > 0
    assert values["bytes_per_client"] > 0
    assert values["round_overhead_s"] >= 0
    assert (tmp_path / "checkpoints" / "step-1.pt").exists()
    # a second run of the same trial (a restart) resumes after the checkpoint of round 1
    out, _ = federation(rounds=2)
    assert "resumed from the checkpoint of round 1" in out
    assert "round 2: 2 clients trained" in out
    assert "round 1:" not in out


def _supervise(folder: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The federated client supervisor (``python -m trainhub.runtime.federated``) running
    ``script`` in ``folder``."""
    return subprocess.run(
        [sys.executable, "-m", "trainhub.runtime.federated", sys.executable, script],
        check=False,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_client_that_crashes_before_joining_ends_with_its_last_line(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text('print("loading")\nraise SystemExit("bad weights file")\n')
    env = {
        **os.environ,
        "RANK": "1",
        "TRAINHUB_FEDERATED": json.dumps({"clients": 1, "rounds": 1}),
    }
    done = _supervise(tmp_path, "crash.py", env)
    assert done.returncode == runner.EXIT_CLIENT_NEVER_JOINED
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith("failed before it joined the federation (exit code 1): bad weights file")


def test_a_client_that_dies_after_the_federation_ended_is_not_restarted(tmp_path: Path) -> None:
    # a client that served a round (it touches the joined file) and then dies while no server
    # listens: the federation ended while it was down, so the rank ends instead of restarting
    # it against a closed port (the trial stayed RUNNING that way)
    (tmp_path / "late.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['TRAINHUB_FEDERATED_JOINED']).touch()\n"
        "print('served a round', flush=True)\n"
        "raise SystemExit(1)\n"
    )
    env = {
        **os.environ,
        "RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_port()),  # free: nothing listens there
        "TRAINHUB_FEDERATED": json.dumps({"clients": 1, "rounds": 1}),
    }
    done = _supervise(tmp_path, "late.py", env)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("served a round") == 1, done.stdout
    assert "no longer listens: the federation is over for this client" in done.stdout
