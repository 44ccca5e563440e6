"""Event files for a tensorboard session (its code context): the metrics trainhub holds, and
the event files the trial wrote itself.

TensorBoard reads ``tensorboard/trial-<id>/events.out.tfevents.*`` (the run ``trial-<id>``):
written with TensorBoard's own event writer (no torch needed on the control plane), one scalar
per metric per reported step, from the points the repository holds. The trial's own files
(service/event_files.py) go under ``tensorboard/trial-<id>/own/`` as the trial laid them out
(runs ``trial-<id>/own/<its folders>``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from trainhub.service.repository import UnitOfWork

LOGDIR = "tensorboard"  # trainhub.core.session_spec.LOGDIR_NAME
MAX_POINTS_PER_TRIAL = 100_000


def tensorboard_files(
    uow: UnitOfWork,
    trial_ids: Sequence[int],
    own_files: Callable[[int], dict[str, bytes]] | None = None,
) -> dict[str, bytes]:
    """``{path in the context: bytes}``: one event file per trial of its metrics, and the
    event files each trial wrote (``own_files``)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="th-tb-") as scratch:
        for trial_id in trial_ids:
            with uow() as repo:
                points = repo.list_metrics(trial_id, limit=MAX_POINTS_PER_TRIAL)
            folder = Path(scratch) / f"trial-{trial_id}"
            writer = EventFileWriter(str(folder))
            for point in points:
                values = [
                    Summary.Value(tag=name, simple_value=float(value))
                    for name, value in point.values.items()
                ]
                writer.add_event(
                    Event(
                        wall_time=point.reported_at,
                        step=point.step,
                        summary=Summary(value=values),
                    )
                )
            writer.close()
            for path in folder.iterdir():
                files[f"{LOGDIR}/trial-{trial_id}/{path.name}"] = path.read_bytes()
            for name, content in (own_files(trial_id) if own_files else {}).items():
                if ".." not in name.split("/") and not name.startswith("/"):
                    files[f"{LOGDIR}/trial-{trial_id}/own/{name}"] = content
    return files
