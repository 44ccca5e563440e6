"""``trainhub tensorboard TRIAL`` over the event files the trial wrote itself (issue 26), beside
the metrics trainhub holds: a real trial script writes scalars with torch's SummaryWriter in
its checkpoint folder; a tensorboard session (the rig of test_session_proxy.py: a real
TensorBoard behind the proxy) shows both runs; when the trial ended and its folder is removed,
the files kept in the artifact store show the same."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.web.test_session_proxy import Rig, open_rig
from trainhub.adapters.ray_executor.trial_folders import event_files
from trainhub.adapters.tensorboard_export import tensorboard_files
from trainhub.service.event_files import EventFileService

pytestmark = [pytest.mark.slow]

WRITER = """
import os
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(log_dir=os.path.join(os.environ["TRAINHUB_CHECKPOINT_DIR"], "tb"))
for step in range(4):
    writer.add_scalar("own/accuracy", 0.25 * (step + 1), step)
writer.close()
"""


class TrialFolders:
    """Each trial's checkpoint folder under one root, as the executor's storage root has them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, trial_id: int) -> Path:
        return self.root / f"trial-{trial_id}"

    def trial_event_files(self, trial_id: int, max_bytes: int) -> dict[str, bytes]:
        return event_files(self.folder(trial_id), max_bytes)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with open_rig(tmp_path_factory.mktemp("tb-own")) as built:
        yield built


def _tags(rig: Rig, session: dict[str, object]) -> dict[str, dict[str, object]]:
    url = f"{rig.url}{session['url']}data/plugin/scalars/tags"
    answer = httpx.get(url, headers=rig.headers(rig.alice), timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _scalars(rig: Rig, session: dict[str, object], run: str, tag: str) -> list[float]:
    answer = httpx.get(
        f"{rig.url}{session['url']}data/plugin/scalars/scalars",
        params={"run": run, "tag": tag},
        headers=rig.headers(rig.alice),
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return [round(value, 3) for _, _, value in answer.json()]


def test_tensorboard_shows_the_event_files_a_trial_wrote(rig: Rig, tmp_path: Path) -> None:
    folders = TrialFolders(tmp_path / "trials")
    keeper = EventFileService(rig.api.services.uow, rig.api.store, folders)
    rig.service.tensorboard_files = lambda trials: tensorboard_files(
        rig.api.services.uow, trials, keeper.files
    )
    experiment = submit(rig.api, rig.alice).json()
    trial_id = int(experiment["trials"][0]["id"])
    own = start_attempt(rig.api, trial_id)
    points = [{"step": s, "values": {"loss": 1.0 / (s + 1)}} for s in range(3)]
    r = rig.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics", json={"points": points}, headers=own
    )
    assert r.status_code in (200, 202), r.text
    # the trial's script, as a rank runs it, writes its own event file
    folder = folders.folder(trial_id)
    folder.mkdir(parents=True)
    env = {**os.environ, "TRAINHUB_CHECKPOINT_DIR": str(folder)}
    subprocess.run([sys.executable, "-c", WRITER], env=env, check=True, timeout=300)
    assert list((folder / "tb").glob("events.out.tfevents.*"))

    session = rig.start(kind="tensorboard", trials=[trial_id])
    tags = _tags(rig, session)
    own_run = f"trial-{trial_id}/own/tb"
    assert set(tags) == {f"trial-{trial_id}", own_run}, tags
    assert "loss" in tags[f"trial-{trial_id}"]  # the metrics trainhub holds, beside
    assert _scalars(rig, session, own_run, "own/accuracy") == [0.25, 0.5, 0.75, 1.0]

    # the trial ended: its files are kept before its folder goes, and shown from the store
    keeper.keep(trial_id)
    shutil.rmtree(folder)
    kept = keeper.files(trial_id)
    assert [name.split("/")[0] for name in kept] == ["tb"]
    again = rig.start(kind="tensorboard", trials=[trial_id])
    assert _scalars(rig, again, own_run, "own/accuracy") == [0.25, 0.5, 0.75, 1.0]
