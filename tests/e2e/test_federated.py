"""Federated trials end to end: a real control plane process, the session's Ray head, the
bubblewrap sandbox and Flower's real server and clients (CPU, digits, a tiny MLP)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir, rank_pids
from trainhub.adapters.sandbox import bwrap_problem
from trainhub.client import TrainhubClient
from trainhub.client.datasets import push_dataset
from trainhub.core.partition import partition_indices

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORKLOAD = Path(__file__).parent / "federated_workload"
EXAMPLE_CLIENT = Path(__file__).parents[2] / "examples" / "federated" / "client.py"


def spec(
    name: str, *, clients: int = 4, rounds: int = 3, dataset: str = "digits", **more: Any
) -> str:
    hparams = {"lr": 0.05, "local_epochs": 1, **more.pop("hparams", {})}
    body: dict[str, Any] = {
        "name": name,
        "kind": "federated",
        "entrypoint": more.pop("entrypoint", "python client.py"),
        "resources": {"cpus_per_worker": 0.1},
        "max_restarts": more.pop("max_restarts", 0),
        "hyperparameters": hparams,
        "federated": {
            "clients": clients,
            "rounds": rounds,
            "strategy": "fedavg",
            "min_available_clients": more.pop("min_available_clients", clients),
            "rejoin_wait_s": more.pop("rejoin", 30),
            "partition": {"dataset": dataset, "scheme": "dirichlet", "alpha": 0.5, "seed": 1},
        },
        **more,
    }
    return json.dumps(body)


@pytest.fixture(scope="module")
def plane(
    ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlaneProcess]:
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    home = tmp_path_factory.mktemp("federated") / "home"
    home.mkdir()
    plane = ControlPlaneProcess(home, ray_address, settings={"sandbox": "bwrap"})
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test's client folder: its client.py subclasses the example's client, which goes
    into the context beside it as ``federated_example.py`` (one client, the example's)."""
    folder = tmp_path_factory.mktemp("federated-workload")
    for path in WORKLOAD.glob("*.py"):
        shutil.copy(path, folder / path.name)
    shutil.copy(EXAMPLE_CLIENT, folder / "federated_example.py")
    return folder


def submit(plane: ControlPlaneProcess, text: str, workload: Path) -> int:
    return int(plane.submit(text, workload)["trials"][0]["id"])


def by_step(plane: ControlPlaneProcess, trial_id: int) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for point in plane.metrics(trial_id):
        rows.setdefault(int(point["step"]), {}).update(
            point.get("values")
            or {k: v for k, v in point.items() if k not in ("step", "time", "timestamp")}
        )
    return rows


def test_two_federations_at_once_one_with_a_client_killed_in_round_two(
    plane: ControlPlaneProcess, workload: Path, tmp_path: Path
) -> None:
    # federation A reads a pushed dataset: each client may read its own share only
    digits = load_digits()
    folder = tmp_path / "digits-np"
    folder.mkdir()
    np.save(folder / "x.npy", digits.images.reshape(-1, 1, 8, 8).astype(np.float32))
    np.save(folder / "y.npy", digits.target)
    with TrainhubClient(plane.url, plane.token) as admin:
        push_dataset(admin, "digits-np", folder)
    clean = submit(
        plane,
        spec(
            "fl-clean",
            dataset="digits-np",
            data=[{"name": "digits-np", "mount": "/data/digits"}],
            environment={"variables": {"TRAINHUB_FEDERATED_PROBE": "1"}},
        ),
        workload,
    )
    killed = submit(
        plane,
        # the killed client's restart (a sandboxed Python importing torch and flwr) took more
        # than the default 30 s on a loaded CI machine: round 3 went on without it
        spec("fl-kill", min_available_clients=3, hparams={"kill_client": "1:2"}, rejoin=180),
        workload,
    )
    done = lambda t: t["state"] == "COMPLETED"  # noqa: E731
    plane.wait_for(clean, done, timeout_s=240, what="COMPLETED")
    plane.wait_for(killed, done, timeout_s=240, what="COMPLETED")

    rows = by_step(plane, clean)
    assert sorted(rows) == [1, 2, 3], rows
    for values in rows.values():
        assert values["clients_fit"] == 4
        assert values["clients_failed"] == 0
        assert 0.0 <= values["val_accuracy"] <= 1.0
        assert values["client0/bytes_sent"] > 0
        assert values["client3/bytes_received"] > 0
        assert "client2/train_loss" in values
        assert "client2/fit_s" in values
        assert values["round_overhead_s"] >= 0
    # its own partition, and no other share nor the whole set anywhere in its sandbox
    shares = partition_indices(digits.target, 4, alpha=0.5, seed=1)
    for rank in range(1, 5):
        log = plane.log(clean, rank)
        match = re.search(r"^PARTITION (\S+) (\[.*\])$", log, re.M)
        assert match, log[-2000:]
        assert match.group(1) == "/data/digits"
        assert json.loads(match.group(2)) == shares[rank - 1].tolist()
        seen = json.loads(re.search(r"^SEEN (\[.*\])$", log, re.M).group(1))  # type: ignore[union-attr]
        assert seen == ["/data/digits/indices.npy", "/data/digits/x.npy"], seen
    assert "federation ready: 4 clients connected" in plane.log(clean, 0)

    rows = by_step(plane, killed)
    assert sorted(rows) == [1, 2, 3], rows
    assert rows[2]["clients_failed"] == 1, rows[2]
    assert rows[2]["clients_fit"] == 3, rows[2]
    assert rows[3]["clients_fit"] == 4, rows[3]  # the killed client rejoined
    log = plane.log(killed, 2)
    assert "KILLING client 1 in round 2" in log
    assert "restarting it to rejoin" in log
    assert plane.trial(killed)["num_attempts"] == 1


def test_a_killed_server_resumes_from_its_last_round(
    plane: ControlPlaneProcess, workload: Path
) -> None:
    trial_id = submit(
        plane,
        spec("fl-server", clients=2, rounds=4, max_restarts=1, hparams={"sleep_s": 1.0}),
        workload,
    )
    deadline = time.monotonic() + 180
    while 2 not in by_step(plane, trial_id):
        assert time.monotonic() < deadline, plane.log(trial_id, 0)[-3000:]
        time.sleep(0.2)
    reported = max(by_step(plane, trial_id))
    pids = rank_pids(trial_id, 0)
    assert pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    plane.wait_for(trial_id, lambda t: t["state"] == "COMPLETED", timeout_s=240, what="COMPLETED")
    assert plane.trial(trial_id)["num_attempts"] == 2
    log = plane.log(trial_id, 0, attempt=2)
    # the last round checkpointed before the kill: the one reported, or the next one, whose
    # checkpoint may be stored between the read of the metrics and the kill
    resumed = re.search(r"resumed from the checkpoint of round (\d+)", log)
    assert resumed, log[-2000:]
    done = int(resumed.group(1))
    assert reported <= done < 4, (reported, log[-2000:])
    assert f"rounds {done + 1}..4" in log, log[-2000:]
    assert sorted(by_step(plane, trial_id)) == [1, 2, 3, 4]


def test_client_code_that_crashes_on_import_fails_the_job_once(
    plane: ControlPlaneProcess, workload: Path
) -> None:
    trial_id = submit(
        plane, spec("fl-crash", clients=2, entrypoint="python crash.py", max_restarts=3), workload
    )
    trial = plane.wait_for(trial_id, lambda t: t["state"] == "FAILED", timeout_s=180, what="FAILED")
    assert trial["num_attempts"] == 1
    text = json.dumps(trial)
    assert "failed before it joined the federation" in text, text
    assert "client code broke on import: no weights for layer fc3" in text, text


def test_bad_federated_specs_are_refused_naming_the_field(
    plane: ControlPlaneProcess, workload: Path
) -> None:
    def refused(text: str) -> dict[str, Any]:
        r = plane.request(
            "POST",
            "/experiments",
            data={"spec": text},
            files={"context": ("c.tar.gz", pack_dir(workload), "application/gzip")},
        )
        assert r.status_code == 422, r.text
        return dict(r.json())

    body = json.loads(spec("bad"))
    body["federated"]["strategy"] = "fedsgd"
    assert "federated.strategy" in json.dumps(refused(json.dumps(body)))
    body = json.loads(spec("bad", clients=500))
    assert "federated.clients" in json.dumps(refused(json.dumps(body)))
