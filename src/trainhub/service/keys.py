"""Where each artifact lives in the store: every tenant has its own area."""

from __future__ import annotations


def context_key(tenant: str, experiment_id: int) -> str:
    return f"tenants/{tenant}/contexts/experiment-{experiment_id}.tar.gz"


def staged_context_key(tenant: str, upload_id: str) -> str:
    """A context stored before its experiment row exists (named by a random upload id)."""
    return f"tenants/{tenant}/contexts/upload-{upload_id}.tar.gz"


def checkpoint_key(tenant: str, trial_id: int, uuid: str) -> str:
    return f"tenants/{tenant}/checkpoints/trial-{trial_id}/{uuid}.ckpt"


def event_files_key(tenant: str, trial_id: int) -> str:
    """The TensorBoard event files a trial wrote, kept when its folder goes (one tar)."""
    return f"tenants/{tenant}/tensorboard/trial-{trial_id}.tar"


SET_SUFFIX = ".shards"


def checkpoint_set_key(tenant: str, trial_id: int, uuid: str) -> str:
    """The prefix of a sharded checkpoint: one object per rank's file under it, published by
    its ``MANIFEST.json`` (ADR 0040)."""
    return f"tenants/{tenant}/checkpoints/trial-{trial_id}/{uuid}{SET_SUFFIX}"


def is_checkpoint_set(storage_key: str) -> bool:
    return storage_key.endswith(SET_SUFFIX)


def log_key(tenant: str, trial_id: int, attempt: int, rank: int) -> str:
    return f"tenants/{tenant}/logs/trial-{trial_id}/attempt-{attempt}/rank-{rank}.log"


def attempt_key(trial_id: int, attempt: int) -> str:
    return f"t{trial_id}-a{attempt}"
