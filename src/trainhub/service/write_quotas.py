"""What trials write on their nodes, held against their storage quotas as they run.

The control loop hands every poll's rank statuses to :meth:`WriteQuotas.observe`; once a
tick, :meth:`WriteQuotas.overdrawn` writes the measurements that changed and names the trials
over their trial's or their tenant's quota (core/write_quota.py), which the loop then stops
with that reason. A folder that several ranks see (the checkpoint folder of a trial, an
attempt's spool) is counted once, by its path: on a shared file system every node measures
the same folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainhub.core.write_quota import TrialWritten, over_quota
from trainhub.service.ports import AttemptStatus
from trainhub.service.repository import Repository
from trainhub.service.tracking import StorageQuota

NOTICEABLE_BYTES = 1024 * 1024


class WriteQuotas:
    def __init__(self) -> None:
        self._measured: dict[int, int] = {}  # trial id -> bytes, as last measured
        self._written: dict[int, int] = {}  # trial id -> bytes, as last written to the db
        self._stopped: set[int] = set()  # trials already asked to stop for their quota

    def observe(self, trial_id: int, status: AttemptStatus) -> None:
        folders: dict[str, int] = {}
        for rank in status.ranks:
            folders.update(rank.disk)
        if folders:
            self._measured[trial_id] = sum(folders.values())

    def forget(self, trial_ids: Iterable[int]) -> None:
        for trial_id in trial_ids:
            self._measured.pop(trial_id, None)
            self._written.pop(trial_id, None)
            self._stopped.discard(trial_id)

    def changed(self, tenants_of: Mapping[int, str]) -> dict[int, int]:
        """The active trials whose measurement changed noticeably since it was written."""
        return {
            t: b
            for t, b in self._measured.items()
            if t in tenants_of and _noticeable(self._written.get(t), b)
        }

    def overdrawn(self, repo: Repository, tenants_of: Mapping[int, str]) -> list[tuple[int, str]]:
        """Write the measurements that changed noticeably; return (trial id, reason) for each
        active trial (``tenants_of``: id -> tenant) to stop now. A few aggregate queries per
        tick, whatever the number of trials (ADR 0025's tick stays cheap)."""
        changed = self.changed(tenants_of)
        if not changed:
            return []
        repo.record_disk_bytes(changed)
        self._written.update(changed)
        checkpoints = repo.checkpoint_bytes_by_tenant()
        disks = repo.disk_bytes_by_tenant()
        kept = repo.checkpoint_bytes_of(sorted(changed))
        quotas = {t.name: StorageQuota.of(t) for t in repo.list_tenants()}
        found = []
        for trial_id in sorted(changed):
            tenant = tenants_of[trial_id]
            quota = quotas.get(tenant)
            if trial_id in self._stopped or quota is None:
                continue
            written = TrialWritten(trial_id, tenant, kept.get(trial_id, 0), changed[trial_id])
            tenant_bytes = checkpoints.get(tenant, 0) + disks.get(tenant, 0)
            reason = over_quota(
                written, quota.max_trial_storage_bytes, tenant_bytes, quota.max_storage_bytes
            )
            if reason is not None:
                self._stopped.add(trial_id)
                found.append((trial_id, reason))
        return found


def _noticeable(written: int | None, measured: int) -> bool:
    """Worth a write: a first measurement, or a change of at least 1 MiB and 1%."""
    if written is None:
        return True
    return abs(measured - written) >= max(NOTICEABLE_BYTES, written // 100)
