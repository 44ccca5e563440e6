"""TensorBoard event files the trials wrote themselves (``torch.utils.tensorboard``'s
SummaryWriter in ``$TRAINHUB_CHECKPOINT_DIR``), for ``trainhub tensorboard`` (docs/sessions.md).

While a trial's folder exists they are read from it; when the trial ended, before its folder
is removed (the control loop's retention), they are kept in the artifact store as one tar
(``tenants/<tenant>/tensorboard/trial-<id>.tar``), at most ``MAX_BYTES_PER_TRIAL`` (the
newest files first).
"""

from __future__ import annotations

import io
import logging
import tarfile

from trainhub.service import keys
from trainhub.service.ports import ArtifactStore, TrialEventFiles
from trainhub.service.repository import UnitOfWork

log = logging.getLogger(__name__)

MAX_BYTES_PER_TRIAL = 64 * 1024 * 1024


class EventFileService:
    def __init__(
        self, uow: UnitOfWork, store: ArtifactStore, source: TrialEventFiles | None
    ) -> None:
        self.uow = uow
        self.store = store
        self.source = source

    def _key(self, trial_id: int) -> str | None:
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            experiment = repo.get_experiment(trial.experiment_id) if trial else None
        return keys.event_files_key(experiment.tenant, trial_id) if experiment else None

    def keep(self, trial_id: int) -> None:
        """Store the ended trial's event files (its folder is removed next)."""
        if self.source is None:
            return
        files = self.source.trial_event_files(trial_id, MAX_BYTES_PER_TRIAL)
        key = self._key(trial_id)
        if not files or key is None:
            return
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, content in sorted(files.items()):
                info = tarfile.TarInfo(name)
                info.size = len(content)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
        self.store.put(key, buffer.getvalue())
        log.info("trial %d: kept %d TensorBoard event files", trial_id, len(files))

    def files(self, trial_id: int) -> dict[str, bytes]:
        """The trial's event files: from its folder while it has one, else the kept ones."""
        if self.source is not None:
            live = self.source.trial_event_files(trial_id, MAX_BYTES_PER_TRIAL)
            if live:
                return live
        key = self._key(trial_id)
        if key is None or not self.store.exists(key):
            return {}
        out = {}
        with tarfile.open(fileobj=io.BytesIO(self.store.get(key))) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    out[member.name] = extracted.read()
        return out
