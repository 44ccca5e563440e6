"""What the launcher told this process: torchrun's variables and trainhub's ``TRAINHUB_*``.

Read once by :func:`trainhub.init`; every error names the variable and what it should hold.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhub.runtime import protocol


@dataclass(frozen=True)
class LaunchEnv:
    """The launch environment of one rank.

    Attributes:
        rank: Global rank (``RANK``), 0 when unset.
        local_rank: Rank on this node (``LOCAL_RANK``).
        world_size: Number of ranks (``WORLD_SIZE``), 1 when unset.
        local_world_size: Ranks on this node (``LOCAL_WORLD_SIZE``).
        api_url: Control plane URL; ``None`` means standalone (no control plane).
        token: Bearer token of this trial.
        trial_id: The trial this process belongs to (managed mode only).
        experiment_id: Its experiment, when the executor says.
        attempt: 1 for the first run of the trial, 2 after a restart, ...
        hparams: Hyperparameters from ``TRAINHUB_HPARAMS``.
        restore_checkpoint_id: Checkpoint to resume from, if any.
        distributed: The spec's ``distributed`` section, if any.
        spool_dir: Node-local scratch directory of this attempt, if the executor gave one.
        searcher_metric: The searcher's metric of a search or PBT trial, if any.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    api_url: str | None = None
    token: str | None = None
    trial_id: int | None = None
    experiment_id: int | None = None
    attempt: int = 1
    hparams: Mapping[str, Any] = field(default_factory=dict)
    restore_checkpoint_id: int | None = None
    distributed: Mapping[str, Any] | None = None
    spool_dir: Path | None = None
    searcher_metric: str | None = None

    @property
    def managed(self) -> bool:
        """Launched by the control plane (it gave an API URL)."""
        return self.api_url is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        env = os.environ if environ is None else environ
        world_size = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0, minimum=0)
        if rank >= world_size:
            raise ValueError(f"RANK={rank} must be smaller than WORLD_SIZE={world_size}")
        api_url = env.get(protocol.ENV_API_URL) or None
        trial_id = _optional_int(env, protocol.ENV_TRIAL_ID)
        if api_url is not None and trial_id is None:
            raise ValueError(
                f"{protocol.ENV_API_URL} is set but {protocol.ENV_TRIAL_ID} is not: the executor "
                f"must set both (unset {protocol.ENV_API_URL} to run standalone)"
            )
        spool = env.get(protocol.ENV_SPOOL_DIR) or None
        return cls(
            rank=rank,
            local_rank=_int(env, "LOCAL_RANK", 0, minimum=0),
            world_size=world_size,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1, minimum=1),
            api_url=api_url.rstrip("/") if api_url else None,
            token=env.get(protocol.ENV_TOKEN) or None,
            trial_id=trial_id,
            experiment_id=_optional_int(env, protocol.ENV_EXPERIMENT_ID),
            attempt=_int(env, protocol.ENV_ATTEMPT, 1, minimum=1),
            hparams=_json_object(env, protocol.ENV_HPARAMS) or {},
            restore_checkpoint_id=_optional_int(env, protocol.ENV_RESTORE_CHECKPOINT),
            distributed=_json_object(env, protocol.ENV_DISTRIBUTED),
            spool_dir=Path(spool) if spool else None,
            searcher_metric=env.get(protocol.ENV_SEARCHER_METRIC) or None,
        )


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    value = _optional_int(env, name)
    if value is None:
        return default
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any] | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value
