"""Where each artifact lives in the store: every tenant has its own area."""

from __future__ import annotations


def context_key(tenant: str, experiment_id: int) -> str:
    return f"tenants/{tenant}/contexts/experiment-{experiment_id}.tar.gz"


def staged_context_key(tenant: str, upload_id: str) -> str:
    """A context stored before its experiment row exists (named by a random upload id)."""
    return f"tenants/{tenant}/contexts/upload-{upload_id}.tar.gz"


def checkpoint_key(tenant: str, trial_id: int, uuid: str) -> str:
    return f"tenants/{tenant}/checkpoints/trial-{trial_id}/{uuid}.ckpt"


def log_key(tenant: str, trial_id: int, attempt: int, rank: int) -> str:
    return f"tenants/{tenant}/logs/trial-{trial_id}/attempt-{attempt}/rank-{rank}.log"


def attempt_key(trial_id: int, attempt: int) -> str:
    return f"t{trial_id}-a{attempt}"
