"""Whether what a trial wrote passes its storage quotas: the checkpoints the API received plus
what its nodes measured in its checkpoint folder, home and scratch (issue 24).

Pure: plain numbers in, a reason with the numbers out (None: within every quota).
"""

from __future__ import annotations

from dataclasses import dataclass


def gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


@dataclass(frozen=True)
class TrialWritten:
    """One trial's bytes: checkpoints stored through the API, and its folders on its nodes."""

    trial_id: int
    tenant: str
    checkpoint_bytes: int
    disk_bytes: int

    @property
    def total(self) -> int:
        return self.checkpoint_bytes + self.disk_bytes


def over_quota(
    written: TrialWritten, max_trial_bytes: int, tenant_bytes: int, max_tenant_bytes: int
) -> str | None:
    """Why the trial must stop, with the numbers, or None.

    ``tenant_bytes`` is everything the tenant holds (checkpoints and measured folders of all
    its trials, this one included).
    """
    where = (
        f"{gib(written.disk_bytes)} in its checkpoint folder, home and scratch and "
        f"{gib(written.checkpoint_bytes)} of checkpoints"
    )
    if written.total > max_trial_bytes:
        return (
            f"storage quota exceeded: trial {written.trial_id} holds {gib(written.total)} "
            f"({where}); its quota is {gib(max_trial_bytes)}"
        )
    if tenant_bytes > max_tenant_bytes and written.disk_bytes > 0:
        return (
            f"storage quota exceeded: tenant {written.tenant!r} holds {gib(tenant_bytes)}, "
            f"its quota is {gib(max_tenant_bytes)} (trial {written.trial_id}: {where})"
        )
    return None
