"""The debugging routes: sample records in (the trial's token only), reports, CSV, PNG, and a
clone without the flagged samples."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api, build_api
from trainhub.adapters.db.sample_store import SqlSampleStore
from trainhub.core.label_noise import score_samples
from trainhub.core.sample_dynamics import pack, records_from_columns, unpack
from trainhub.service.debugging import StoredBatch

NUM, EPOCHS = 120, 6
FLIPPED = [3, 17, 44, 80, 101]  # sample ids whose given label is wrong


def dynamics(epoch: int, uuid: str) -> dict[str, Any]:
    """One epoch of records: flipped samples sit at a negative margin, predicted as class 9."""
    rng = np.random.default_rng(epoch)
    ids = np.arange(NUM)
    flipped = np.isin(ids, FLIPPED)
    labels = ids % 9
    margins = np.where(flipped, -1.5, 1.0 + 0.2 * epoch) + rng.normal(0, 0.2, NUM)
    probs = 1 / (1 + np.exp(-margins))
    return {
        "attempt": 1,
        "uuid": uuid,
        "source": "digits",
        "num_classes": 10,
        "ids": ids.tolist(),
        "epochs": [epoch] * NUM,
        "labels": labels.tolist(),
        "predictions": np.where(flipped, 9, labels).tolist(),
        "margins": margins.round(3).tolist(),
        "probs": probs.round(3).tolist(),
        "losses": (-np.log(probs)).round(3).tolist(),
    }


def tracked_trial(api: Api) -> tuple[int, dict[str, str], dict[str, str]]:
    alice = api.user("alice", "vision")
    trial_id = submit(api, alice).json()["trials"][0]["id"]
    own = start_attempt(api, trial_id)
    for epoch in range(EPOCHS):
        r = api.client.post(
            f"/api/v1/trials/{trial_id}/samples", json=dynamics(epoch, f"e{epoch}"), headers=own
        )
        assert r.status_code == 204, r.text
    return trial_id, own, api.headers(alice)


def test_records_in_report_out(bapi: Api) -> None:
    trial_id, own, alice = tracked_trial(bapi)
    # a retry stores nothing twice
    again = bapi.client.post(
        f"/api/v1/trials/{trial_id}/samples", json=dynamics(0, "e0"), headers=own
    )
    assert again.status_code == 204
    r = bapi.client.get(f"/api/v1/trials/{trial_id}/debug", params={"top": 8}, headers=alice)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["num_samples"] == NUM
    assert report["num_records"] == NUM * EPOCHS
    assert report["epochs"] == EPOCHS
    assert report["num_flagged"] == len(FLIPPED)
    top = report["suspicious"]
    assert {s["id"] for s in top[: len(FLIPPED)]} == set(FLIPPED)
    assert [s["score"] for s in top] == sorted((s["score"] for s in top), reverse=True)
    assert all(s["suggested"] == 9 and s["region"] == "hard" for s in top[: len(FLIPPED)])
    classes = report["classes"]
    assert len(classes["confusion"]) == 10
    assert sum(map(sum, classes["confusion"])) == NUM
    assert {p["predicted"] for p in classes["confused_pairs"]} == {9}
    assert sum(report["regions"].values()) == NUM
    # CSV: every sample, most suspicious first
    r = bapi.client.get(f"/api/v1/trials/{trial_id}/debug/samples.csv", headers=alice)
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == NUM
    assert {int(row["id"]) for row in rows[: len(FLIPPED)]} == set(FLIPPED)
    # PNG of digits images
    r = bapi.client.get(f"/api/v1/trials/{trial_id}/debug/grid.png", headers=alice)
    assert r.status_code == 200, r.text
    assert r.content.startswith(b"\x89PNG")


def test_only_the_trials_own_runtime_writes_and_bad_batches_are_named(bapi: Api) -> None:
    trial_id, own, alice = tracked_trial(bapi)
    r = bapi.client.post(
        f"/api/v1/trials/{trial_id}/samples", json=dynamics(9, "by-user"), headers=alice
    )
    assert r.status_code == 403, r.text
    bad = {**dynamics(9, "bad"), "labels": [11] * NUM}
    r = bapi.client.post(f"/api/v1/trials/{trial_id}/samples", json=bad, headers=own)
    assert r.status_code == 422
    assert "labels" in r.text
    short = {**dynamics(9, "short"), "probs": [0.5]}
    r = bapi.client.post(f"/api/v1/trials/{trial_id}/samples", json=short, headers=own)
    assert r.status_code == 422
    assert "probs" in r.text
    # a trial without records: 409 with a hint
    other = submit(bapi, alice["Authorization"].split()[1]).json()["trials"][0]["id"]
    r = bapi.client.get(f"/api/v1/trials/{other}/debug", headers=alice)
    assert r.status_code == 409
    assert "track_samples" in r.text


def test_clone_drops_the_flagged_samples_and_relabels(bapi: Api) -> None:
    trial_id, _, alice = tracked_trial(bapi)
    r = bapi.client.post(
        f"/api/v1/trials/{trial_id}/clone",
        json={"drop_flagged": 0.05, "relabel": {"7": 2}, "from_checkpoint": False},
        headers=alice,
    )
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    chosen = json.loads(spec["environment"]["variables"]["TRAINHUB_SAMPLE_FILTER"])
    assert set(FLIPPED) <= set(chosen["drop"])
    assert len(chosen["drop"]) == round(0.05 * NUM)
    assert chosen["relabel"] == {"7": 2}
    r = bapi.client.post(
        f"/api/v1/trials/{trial_id}/clone", json={"relabel": {"x": 2}}, headers=alice
    )
    assert r.status_code == 400, r.text


def test_clone_refuses_relabels_of_untracked_samples_or_to_unknown_classes(bapi: Api) -> None:
    trial_id, _, alice = tracked_trial(bapi)
    r = bapi.client.post(
        f"/api/v1/trials/{trial_id}/clone",
        json={"relabel": {"7": 2, str(NUM + 5): 1, "8": 10}, "from_checkpoint": False},
        headers=alice,
    )
    assert r.status_code == 422, r.text
    errors = {e["path"]: e["message"] for e in r.json()["errors"]}
    assert errors == {
        f"relabel.{NUM + 5}": "the trial tracked no sample with this id",
        "relabel.8": "label 10 is not a class of the trial (0 .. 9)",
    }
    # a trial without sample records has nothing to check against
    other = submit(bapi, alice["Authorization"].split()[1]).json()["trials"][0]["id"]
    r = bapi.client.post(
        f"/api/v1/trials/{other}/clone",
        json={"relabel": {"7": 2}, "from_checkpoint": False},
        headers=alice,
    )
    assert r.status_code == 201, r.text


def test_request_errors_name_the_choices_and_say_what_to_do(bapi: Api) -> None:
    r = bapi.client.get("/api/v1/trials/1/debug?score=x", headers=bapi.headers())
    assert r.status_code == 422
    assert r.json()["errors"] == [
        {
            "path": "score",
            "message": "'x' is not allowed; use 'aum', 'confidence', 'forgetting' or 'combined'",
            "hint": "",
        }
    ]
    r = bapi.client.post("/api/v1/models", json={"name": "bad name!"}, headers=bapi.headers())
    assert r.status_code == 422
    hints = {e["path"]: e["hint"] for e in r.json()["errors"]}
    assert hints == {
        "trial_id": "add it to the request",
        "name": "use letters, digits, '-', '_' and '.', starting with a letter or digit",
    }


@pytest.mark.postgres
def test_sample_store_on_every_database(db_url: str, tmp_path: Path) -> None:
    api = build_api(db_url, tmp_path)
    try:
        trial_id = submit(api, api.user("alice", "vision")).json()["trials"][0]["id"]
        store = SqlSampleStore(api.services.uow.engine)  # type: ignore[attr-defined]
        records = records_from_columns(dynamics(0, "x"), 10)
        batch = StoredBatch(1, "digits", 10, len(records), pack(records))
        assert store.add_batch(trial_id, batch, "u-1", 1.0)
        assert not store.add_batch(trial_id, batch, "u-1", 1.0)
        assert store.count_records(trial_id) == NUM
        (back,) = store.batches(trial_id)
        assert back.source == "digits"
        assert score_samples(unpack(back.data)).flagged.sum() == len(FLIPPED)
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_the_control_plane_draws_grids_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from trainhub.adapters.sample_gallery import DatasetGallery\n"
        "from trainhub.service.debugging import Tile\n"
        "png = DatasetGallery().grid_png('digits', [Tile(5, 1, 2, 0.5)])\n"
        "assert png.startswith(b'\\x89PNG')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
