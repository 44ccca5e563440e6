"""Use cases of what trials report: metrics, checkpoints, logs, and the stop signal."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainhub.core.errors import InvalidRequest, NotFound
from trainhub.core.spec import ExperimentSpec
from trainhub.core.states import TrialState
from trainhub.service.auth import check_trial_scope
from trainhub.service.clock import Clock
from trainhub.service.keys import checkpoint_key, log_key
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import KEEP, Checkpoint, MetricPoint, Trial, TrialUpdate
from trainhub.service.repository import Repository, UnitOfWork

MAX_LOG_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LogChunk:
    attempt: int
    rank: int
    offset: int
    next_offset: int
    data: bytes
    # the attempt has ended: no more output will arrive
    complete: bool


def _trial_for(repo: Repository, principal: Principal, trial_id: int, write: bool) -> Trial:
    trial = repo.get_trial(trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} does not exist")
    check_trial_scope(principal, trial_id, trial.tenant, write)
    return trial


class TrackingService:
    def __init__(self, uow: UnitOfWork, store: ArtifactStore, clock: Clock) -> None:
        self.uow = uow
        self.store = store
        self.clock = clock

    def record_metrics(
        self,
        principal: Principal,
        trial_id: int,
        attempt: int,
        points: list[tuple[int, dict[str, float]]],
        progress: dict[str, Any] | None = None,
    ) -> None:
        for step, values in points:
            for name, value in values.items():
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise InvalidRequest(f"metric {name!r} at step {step} is not a number")
        now = self.clock()
        with self.uow() as repo:
            trial = _trial_for(repo, principal, trial_id, write=True)
            repo.upsert_metrics(trial_id, attempt, points, now)
            latest = dict(trial.latest_metrics)
            for step, values in sorted(points, key=lambda p: p[0]):
                for name, value in values.items():
                    if math.isfinite(value):
                        latest[name] = value
                latest["step"] = max(step, int(latest.get("step", step)))
            repo.update_trial(
                trial_id, TrialUpdate(latest_metrics=latest, progress=progress or KEEP)
            )

    def list_metrics(
        self, principal: Principal, trial_id: int, after_step: int | None, limit: int
    ) -> list[MetricPoint]:
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_metrics(trial_id, after_step, limit)

    def register_checkpoint(
        self,
        principal: Principal,
        trial_id: int,
        uuid: str,
        step: int,
        attempt: int,
        metrics: dict[str, Any],
        data: bytes,
    ) -> Checkpoint:
        if not uuid or len(uuid) > 64 or not all(c.isalnum() or c in "-_" for c in uuid):
            raise InvalidRequest("checkpoint uuid must be 1-64 letters, digits, '-' or '_'")
        now = self.clock()
        with self.uow() as repo:
            trial = _trial_for(repo, principal, trial_id, write=True)
            existing = repo.get_checkpoint_by_uuid(uuid)
            if existing is not None:
                if existing.trial_id != trial_id:
                    raise InvalidRequest(f"checkpoint uuid {uuid} belongs to another trial")
                return existing  # a retried upload: registered once
            key = checkpoint_key(trial.tenant, trial_id, uuid)
            self.store.put(key, data)
            checkpoint = repo.add_checkpoint(
                trial_id, uuid, step, attempt, metrics, key, len(data), now
            )
            repo.add_event(
                trial_id, "checkpoint", f"checkpoint {checkpoint.id} at step {step}", now
            )
            spec = ExperimentSpec.model_validate(repo.experiment_of(trial_id).spec)
            self._apply_retention(repo, trial_id, spec)
            return checkpoint

    def _apply_retention(self, repo: Repository, trial_id: int, spec: ExperimentSpec) -> None:
        checkpoints = repo.list_checkpoints(trial_id)
        keep: set[int] = set()
        by_step = sorted(checkpoints, key=lambda c: (c.step, c.id), reverse=True)
        # the latest always stays: a restart resumes from it
        keep.update(c.id for c in by_step[: max(1, spec.checkpoints.keep_latest)])
        metric = spec.searcher.metric
        if metric and spec.checkpoints.keep_best:
            scored = [c for c in checkpoints if isinstance(c.metrics.get(metric), int | float)]
            scored.sort(key=lambda c: float(c.metrics[metric]), reverse=spec.searcher.mode == "max")
            keep.update(c.id for c in scored[: spec.checkpoints.keep_best])
        for checkpoint in checkpoints:
            if checkpoint.id not in keep:
                repo.mark_checkpoint_deleted(checkpoint.id)
                self.store.delete(checkpoint.storage_key)

    def list_checkpoints(self, principal: Principal, trial_id: int) -> list[Checkpoint]:
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_checkpoints(trial_id)

    def checkpoint_data(self, principal: Principal, trial_id: int, checkpoint_id: int) -> bytes:
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            checkpoint = repo.get_checkpoint(checkpoint_id)
            if checkpoint is None or checkpoint.trial_id != trial_id:
                raise NotFound(f"checkpoint {checkpoint_id} of trial {trial_id} does not exist")
        return self.store.get(checkpoint.storage_key)

    def signals(self, principal: Principal, trial_id: int) -> tuple[bool, str | None]:
        with self.uow() as repo:
            trial = _trial_for(repo, principal, trial_id, write=False)
        stop = trial.cancel_requested or trial.state in (
            TrialState.PREEMPTING,
            TrialState.CANCELED,
            TrialState.PRUNED,
        )
        return stop, (trial.stop_reason if stop else None)

    def read_logs(
        self,
        principal: Principal,
        trial_id: int,
        attempt: int | None,
        rank: int,
        offset: int,
        limit: int = MAX_LOG_CHUNK_BYTES,
    ) -> LogChunk:
        with self.uow() as repo:
            trial = _trial_for(repo, principal, trial_id, write=False)
            attempts = repo.list_attempts(trial_id)
        if not attempts:
            return LogChunk(0, rank, 0, 0, b"", complete=trial.state.is_terminal)
        if attempt is None:
            chosen = attempts[-1]
        else:
            matching = [a for a in attempts if a.number == attempt]
            if not matching:
                raise NotFound(f"trial {trial_id} has no attempt {attempt}")
            chosen = matching[0]
        if rank < 0 or rank >= len(chosen.placement):
            raise InvalidRequest(
                f"rank {rank} does not exist; attempt {chosen.number} has ranks "
                f"0..{len(chosen.placement) - 1}"
            )
        key = log_key(trial.tenant, trial_id, chosen.number, rank)
        data = self.store.read_range(key, offset, min(limit, MAX_LOG_CHUNK_BYTES))
        return LogChunk(
            chosen.number,
            rank,
            offset,
            offset + len(data),
            data,
            complete=chosen.outcome is not None,
        )
