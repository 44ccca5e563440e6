"""Use cases of what trials report: metrics, checkpoints, logs, and the stop signal."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from trainhub.core import layer_alerts, limits
from trainhub.core.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    TooLarge,
)
from trainhub.core.metric_budget import PointCaps, PointWindow, within_total
from trainhub.core.spec import ExperimentSpec
from trainhub.core.states import TrialState
from trainhub.service.auth import check_trial_scope
from trainhub.service.clock import Clock
from trainhub.service.keys import checkpoint_key, is_checkpoint_set, log_key
from trainhub.service.ports import ArtifactStore, BlobWriter, Principal
from trainhub.service.records import (
    KEEP,
    Checkpoint,
    LayerAlertRecord,
    MetricChunk,
    MetricPoint,
    MetricsTarget,
    Tenant,
    Trial,
    TrialUpdate,
)
from trainhub.service.repository import Repository, UnitOfWork
from trainhub.service.startup import check_rank_marks, record_startup

MAX_LOG_CHUNK_BYTES = 1024 * 1024
_METRIC_NAME = re.compile(limits.METRIC_NAME_PATTERN)


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


def _batch_best(
    searcher: Mapping[str, Any] | None, points: list[tuple[int, dict[str, float]]]
) -> tuple[float, str] | None:
    """The batch's best value of the searcher's metric and the mode (``min`` or ``max``), to
    offer as the experiment's best (what the experiments list sorts by); None: nothing to
    offer."""
    if not isinstance(searcher, Mapping) or not searcher.get("metric"):
        return None
    metric = searcher["metric"]
    values = [v[metric] for _, v in points if isinstance(v.get(metric), int | float)]
    if not values:
        return None
    mode = "min" if searcher.get("mode") == "min" else "max"
    return float(min(values) if mode == "min" else max(values)), mode


def _merge_latest(
    latest: Mapping[str, Any], points: list[tuple[int, dict[str, float]]]
) -> dict[str, Any]:
    """The trial's latest metrics after the batch: each name's value at its highest step, and
    the highest step reported so far."""
    merged = dict(latest)
    for _, values in sorted(points, key=lambda p: p[0]):
        merged.update(values)
    if points:
        top = max(step for step, _ in points)
        merged["step"] = max(top, int(merged.get("step", top)))
    return merged


def _layer_alerts(
    points: list[tuple[int, dict[str, float]]], names: set[str]
) -> list[layer_alerts.LayerAlert]:
    """Alerts from the ``layers/*`` metrics of ``ctx.watch`` (rules: core.layer_alerts); a
    batch without such names is not walked point by point."""
    if not any(name.startswith(layer_alerts.PREFIX) for name in names):
        return []
    return [a for step, values in points for a in layer_alerts.evaluate(step, values)]


def _record_layer_alerts(
    repo: Repository, trial_id: int, alerts: list[layer_alerts.LayerAlert], now: float
) -> None:
    if any(a.kind is layer_alerts.AlertKind.NONFINITE for a in alerts):
        known = [
            a.layer
            for a in repo.list_layer_alerts(trial_id)
            if a.kind == layer_alerts.AlertKind.NONFINITE
        ]
        alerts = layer_alerts.attribute_nonfinite(alerts, known[0] if known else None)
    repo.record_layer_alerts(trial_id, alerts, now)


def _check_metrics_writer(
    repo: Repository, principal: Principal, target: MetricsTarget, attempt: int, now: float
) -> None:
    """The rules of :func:`_writable_trial`, on the one row ``metrics_target`` read."""
    _check_writer(repo, principal, target.trial_id, target.tenant, target.state, "metrics", now)
    if not target.has_attempt:
        _refuse_attempt(repo, target.trial_id, attempt)


def _writable_trial(
    repo: Repository, principal: Principal, trial_id: int, attempt: int, what: str, now: float
) -> Trial:
    """The trial a runtime reports ``what`` to, checked: its own token (or an admin, audited),
    not ended, and the attempt exists."""
    trial = repo.get_trial(trial_id)
    if trial is None:
        raise NotFound(f"trial {trial_id} does not exist")
    _check_writer(repo, principal, trial_id, trial.tenant, trial.state, what, now)
    if attempt not in [a.number for a in repo.list_attempts(trial_id)]:
        _refuse_attempt(repo, trial_id, attempt)
    return trial


def _check_writer(
    repo: Repository,
    principal: Principal,
    trial_id: int,
    tenant: str,
    state: TrialState,
    what: str,
    now: float,
) -> None:
    """Only the trial's own token writes what it reports (an admin too, audited), and only
    while the trial has not ended."""
    check_trial_scope(principal, trial_id, tenant, write=False)
    if principal.trial_id is None:
        if not principal.is_admin:
            raise PermissionDenied(
                f"only trial {trial_id}'s own runtime writes its {what}",
                "the runtime reports with the trial's token (TRAINHUB_TOKEN); users read only",
            )
        repo.add_event(trial_id, "audit", f"{what} written by admin {principal.username}", now)
    if state.is_terminal:
        raise Conflict(
            f"trial {trial_id} already ended ({state}); it takes no more {what}",
            "submit a new experiment to train further",
        )


def _check_disk(target: MetricsTarget) -> None:
    """A trial whose folders on its nodes passed its storage quota hears it from its next
    report (the runtime raises QuotaExceeded); the control loop stops it meanwhile."""
    quota = target.max_trial_storage_bytes or limits.DEFAULT_MAX_TRIAL_STORAGE_BYTES
    if target.disk_bytes > quota:
        raise QuotaExceeded(
            f"trial {target.trial_id} wrote {_gib(target.disk_bytes)} into its checkpoint "
            f"folder, home and scratch; its storage quota is {_gib(quota)}",
            "the trial is being stopped and its folder kept read-only; save less, or ask an "
            "admin to raise it (trainhub tenants update --trial-storage-gb)",
        )


def _refuse_attempt(repo: Repository, trial_id: int, attempt: int) -> NoReturn:
    numbers = [a.number for a in repo.list_attempts(trial_id)]
    have = f"its attempts are {', '.join(map(str, numbers))}" if numbers else "it has none"
    raise InvalidSpec([FieldError("attempt", f"trial {trial_id} has no attempt {attempt}; {have}")])


def check_metric_values(values: Mapping[str, object], where: str) -> list[FieldError]:
    """The metric rule: names of at most 128 letters, digits, '_', '.', '-' or '/'; values
    finite numbers (NaN and infinities are refused: the runtime drops them with a warning),
    never strings or booleans."""
    errors: list[FieldError] = []
    if len(values) > limits.MAX_METRICS_PER_POINT:
        errors.append(
            FieldError(
                where,
                f"{len(values)} metrics in one point; the limit is {limits.MAX_METRICS_PER_POINT}",
            )
        )
        return errors
    for name, value in values.items():
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            shown = str(name)[:40]
            errors.append(
                FieldError(
                    f"{where}.{shown}",
                    "metric names are 1-128 letters, digits, '_', '.', '-' or '/'",
                    "rename the metric",
                )
            )
        elif isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(
                FieldError(f"{where}.{name}", f"must be a number, not {type(value).__name__}")
            )
        elif isinstance(value, int) and not limits.INT64_MIN <= value <= limits.INT64_MAX:
            errors.append(FieldError(f"{where}.{name}", "integer out of the 64-bit range"))
        elif not math.isfinite(value):
            errors.append(
                FieldError(
                    f"{where}.{name}",
                    f"{value} is not a finite number",
                    "NaN and infinities are not stored; report a finite value",
                )
            )
    return errors


def _points_valid(points: list[tuple[int, dict[str, float]]]) -> bool:
    """True when every point passes :func:`check_metric_values` and its step is in range,
    proved with a few whole-batch operations instead of a Python loop per value. False says
    only "look closer": the caller then checks point by point and names what was wrong (a
    valid batch lands here too when its values are integers beyond 64 bits' range, or
    floats whose sum overflows)."""
    if not points:
        return True
    steps = [step for step, _ in points]
    if type(min(steps)) is not int or min(steps) < 0 or max(steps) > limits.INT64_MAX:
        return False
    point_values = [values for _, values in points]
    if max(map(len, point_values)) > limits.MAX_METRICS_PER_POINT:
        return False
    names = set().union(*point_values)
    if not all(type(name) is str and _METRIC_NAME.match(name) for name in names):
        return False
    numbers = [number for values in point_values for number in values.values()]
    if not numbers:
        return True
    if not set(map(type, numbers)) <= {float, int}:
        return False  # bool, str, None, ...: refused
    try:
        total = float(sum(numbers))
    except OverflowError:
        return False
    # a NaN or an infinity makes the sum one; ints must fit 64 bits (floats past that range
    # are valid but take the slow path, which tells them apart)
    return (
        math.isfinite(total)
        and min(numbers) >= limits.INT64_MIN
        and max(numbers) <= limits.INT64_MAX
    )


def retention_victims(checkpoints: list[Checkpoint], spec: ExperimentSpec) -> set[int]:
    """Ids of the checkpoints the spec's retention drops (keep latest N and best M)."""
    keep: set[int] = set()
    by_step = sorted(checkpoints, key=lambda c: (c.step, c.id), reverse=True)
    # the latest always stays: a restart resumes from it
    keep.update(c.id for c in by_step[: max(1, spec.checkpoints.keep_latest)])
    metric = spec.searcher.metric
    if metric and spec.checkpoints.keep_best:
        scored = [c for c in checkpoints if isinstance(c.metrics.get(metric), int | float)]
        scored.sort(key=lambda c: float(c.metrics[metric]), reverse=spec.searcher.mode == "max")
        keep.update(c.id for c in scored[: spec.checkpoints.keep_best])
    return {c.id for c in checkpoints if c.id not in keep}


def delete_checkpoint_blobs(store: ArtifactStore, storage_key: str) -> None:
    """Delete a checkpoint's bytes: one object, or a sharded set (manifest first)."""
    if is_checkpoint_set(storage_key):
        from trainhub.service.artifact_sets import delete_set

        delete_set(store, storage_key)
    else:
        store.delete(storage_key)


def refuse_set(checkpoint: Checkpoint) -> None:
    """Raise for a sharded checkpoint where one file is expected (ADR 0040)."""
    if is_checkpoint_set(checkpoint.storage_key):
        raise Conflict(
            f"checkpoint {checkpoint.id} is sharded: one object per rank's file, not one file",
            f"read GET /trials/{checkpoint.trial_id}/checkpoints/{checkpoint.id}/manifest "
            "and its members, or restore it in a trial with the same memory.fsdp setting",
        )


@dataclass(frozen=True)
class StorageQuota:
    """A tenant's storage quotas in bytes (the server's defaults where its admin set none)."""

    max_checkpoint_bytes: int
    max_trial_storage_bytes: int
    max_storage_bytes: int

    @classmethod
    def of(cls, tenant: Tenant) -> StorageQuota:
        return cls(
            tenant.max_checkpoint_bytes or limits.DEFAULT_MAX_CHECKPOINT_BYTES,
            tenant.max_trial_storage_bytes or limits.DEFAULT_MAX_TRIAL_STORAGE_BYTES,
            tenant.max_storage_bytes or limits.DEFAULT_MAX_TENANT_STORAGE_BYTES,
        )


@dataclass(frozen=True)
class CheckpointUpload:
    """A checkpoint upload that passed every check before its body is read."""

    trial_id: int
    tenant: str
    uuid: str
    step: int
    attempt: int
    metrics: dict[str, Any]
    storage_key: str
    max_bytes: int  # the body may not be longer (the tightest quota left)


def _gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


@dataclass(frozen=True)
class TrialWrites:
    """What a trial wrote and the caps on it, as ``trainhub show`` and the API show them."""

    metric_points: int
    metric_points_dropped: int
    metric_requests_throttled: int  # 429s since this server started (the runtime resent them)
    max_metric_points_per_minute: int
    max_metric_points_per_trial: int
    disk_bytes: int  # its checkpoint folder, home and scratch, as its nodes last measured


class TrackingService:
    def __init__(
        self,
        uow: UnitOfWork,
        store: ArtifactStore,
        clock: Clock,
        point_caps: PointCaps | None = None,
    ) -> None:
        self.uow = uow
        self.store = store
        self.clock = clock
        # bytes of a tenant stored besides checkpoints (registered models, datasets) that
        # share its storage quota; the server wires it
        self.other_bytes: Callable[[str], int] = lambda tenant: 0
        # the searcher's look at a trial's new values of its metric (SearchService.observe_trial,
        # wired by the server): a prune decided on a report is decided before its reply
        self.observe_search: Callable[[int], object] | None = None
        self.point_caps = point_caps or PointCaps()
        # points per trial in the last minute: in this process's memory (one control plane
        # serves the API); a restart forgets at most a minute of it
        self.point_window = PointWindow(self.point_caps)

    def report_metrics(
        self,
        principal: Principal,
        trial_id: int,
        attempt: int,
        points: list[tuple[int, dict[str, float]]],
        progress: dict[str, Any] | None = None,
    ) -> tuple[bool, str | None]:
        """What the runtime's report does: store the batch, let the searcher judge the new
        values of its metric (a prune is decided here, not at the next tick), and answer the
        trial's signals, so the stop rides on this reply."""
        searched = self.record_metrics(principal, trial_id, attempt, points, progress)
        if searched and self.observe_search is not None:
            self.observe_search(trial_id)
        return self.signals(principal, trial_id)

    def writes(self, trial: Trial) -> TrialWrites:
        return TrialWrites(
            trial.metric_points,
            trial.metric_points_dropped,
            self.point_window.throttled(trial.id),
            self.point_caps.per_minute,
            self.point_caps.per_trial,
            trial.disk_bytes,
        )

    def _admit_points(self, principal: Principal, trial_id: int, points: int, now: float) -> None:
        """The per-minute cap, before any database work: a flood costs a dictionary look-up.
        Only the trial's own token spends its budget (another's is refused later, in the
        transaction, and must not throttle it); admins are not throttled."""
        if principal.trial_id != trial_id or not points:
            return
        wait_s = self.point_window.admit(trial_id, points, now)
        if wait_s is not None:
            caps = self.point_caps
            raise RateLimited(
                f"trial {trial_id} sent more than {caps.per_minute} metric points in the last "
                f"minute (this request has {points})",
                f"the runtime waits Retry-After ({wait_s:.0f} s) and sends them again; report "
                "less often (an admin sets the cap)",
                retry_after_s=wait_s,
            )

    def record_startup(
        self,
        principal: Principal,
        trial_id: int,
        attempt: int,
        marks: Mapping[str, object],
        warm: bool,
    ) -> None:
        """Record rank 0's startup marks of one attempt as its startup phases (trial token)."""
        checked = check_rank_marks(marks)
        now = self.clock()
        with self.uow() as repo:
            trial = _writable_trial(repo, principal, trial_id, attempt, "startup marks", now)
            record_startup(repo, trial, repo.list_attempts(trial_id), attempt, checked, warm, now)

    def record_metrics(
        self,
        principal: Principal,
        trial_id: int,
        attempt: int,
        points: list[tuple[int, dict[str, float]]],
        progress: dict[str, Any] | None = None,
    ) -> bool:
        """Store a batch of metric points of one attempt (the trial's own token only).

        Returns whether the batch holds a value of the experiment's searcher metric."""
        if len(points) > limits.MAX_POINTS_PER_REQUEST:
            raise TooLarge(
                f"{len(points)} points in one request; the limit is "
                f"{limits.MAX_POINTS_PER_REQUEST}",
                "send them in several requests (the runtime batches by itself)",
            )
        if not _points_valid(points):
            errors: list[FieldError] = []
            for i, (step, values) in enumerate(points):
                if not 0 <= step <= limits.INT64_MAX:
                    errors.append(FieldError(f"points.{i}.step", "must be in 0..2**63-1"))
                errors.extend(check_metric_values(values, f"points.{i}.values"))
            if errors:
                raise InvalidSpec(errors[:20])
        now = self.clock()
        self._admit_points(principal, trial_id, len(points), now)
        with self.uow() as repo:
            target = repo.metrics_target(trial_id, attempt)
            if target is None:
                raise NotFound(f"trial {trial_id} does not exist")
            _check_metrics_writer(repo, principal, target, attempt, now)
            _check_disk(target)
            # past the trial's total: the rest is dropped and counted (shown with the trial)
            keep, dropped = within_total(target.metric_points, len(points), self.point_caps)
            if dropped:
                points = points[:keep]
                if not points:
                    repo.add_metric_counts(trial_id, 0, dropped)
                    return False
            names = {n for _, values in points for n in values}
            alerts = _layer_alerts(points, names)
            known = set(target.latest_metrics) - {"step"}
            if len(known | names) > limits.MAX_METRIC_NAMES_PER_TRIAL:
                raise InvalidSpec(
                    [
                        FieldError(
                            "points",
                            f"the trial would have {len(known | names)} distinct metric names; "
                            f"the limit is {limits.MAX_METRIC_NAMES_PER_TRIAL} per trial",
                            "report fewer distinct metrics (names are columns, not data)",
                        )
                    ]
                )
            # what the writes need is computed first: on SQLite the first write takes the
            # database's one write lock, held until the commit
            latest = _merge_latest(target.latest_metrics, points)
            best = _batch_best(target.searcher, points)
            repo.upsert_metrics(trial_id, attempt, points, now)
            repo.add_metric_counts(trial_id, len(points), dropped)
            if alerts:
                _record_layer_alerts(repo, trial_id, alerts, now)
            repo.update_trials(
                [(trial_id, TrialUpdate(latest_metrics=latest, progress=progress or KEEP))]
            )
            if best is not None:
                repo.offer_experiment_best(target.experiment_id, *best)
        return best is not None

    def list_metrics(
        self, principal: Principal, trial_id: int, after_step: int | None, limit: int
    ) -> list[MetricPoint]:
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_metrics(trial_id, after_step, limit)

    def list_layer_alerts(
        self, principal: Principal, trial_id: int, limit: int
    ) -> list[LayerAlertRecord]:
        """The trial's layer-health alerts (from the ``layers/*`` metrics), earliest first."""
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_layer_alerts(trial_id, limit)

    def metric_chunks(self, principal: Principal, trial_id: int) -> tuple[list[MetricChunk], int]:
        """Every metric's points as packed chunks, and the number of metric rows (a chart
        reads the rows instead where the chunks do not hold them all: data reported before
        chunks were kept)."""
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_metric_chunks(trial_id), repo.count_metrics(trial_id)

    def begin_checkpoint(
        self,
        principal: Principal,
        trial_id: int,
        uuid: str,
        step: int,
        attempt: int,
        metrics: dict[str, Any],
        declared_bytes: int | None,
    ) -> CheckpointUpload | Checkpoint:
        """Check a checkpoint upload before its body is read.

        Returns the registered checkpoint when ``uuid`` was uploaded before (a retry), or the
        upload to stream into :meth:`open_checkpoint_writer`. ``declared_bytes`` (the request's
        Content-Length) is checked against the quotas here, before any byte is read.
        """
        if not uuid or len(uuid) > 64 or not all(c.isalnum() or c in "-_" for c in uuid):
            raise InvalidRequest("checkpoint uuid must be 1-64 letters, digits, '-' or '_'")
        errors = check_metric_values(metrics, "metrics")
        if errors:
            raise InvalidSpec(errors)
        now = self.clock()
        with self.uow() as repo:
            trial = _writable_trial(repo, principal, trial_id, attempt, "checkpoints", now)
            existing = repo.get_checkpoint_by_uuid(uuid)
            if existing is not None:
                if existing.trial_id != trial_id:
                    raise InvalidRequest(f"checkpoint uuid {uuid} belongs to another trial")
                return existing  # a retried upload: registered once
            room = self._room(repo, trial, step, metrics)
        if declared_bytes is not None and declared_bytes > room[0]:
            raise room[1](declared_bytes)
        return CheckpointUpload(
            trial_id,
            trial.tenant,
            uuid,
            step,
            attempt,
            metrics,
            checkpoint_key(trial.tenant, trial_id, uuid),
            room[0],
        )

    def _room(
        self, repo: Repository, trial: Trial, step: int, metrics: dict[str, Any]
    ) -> tuple[int, Callable[[int], Exception]]:
        """The largest checkpoint the quotas leave room for, and the error for a larger one.

        Checkpoints that retention drops once this one is kept do not count.
        """
        tenant = repo.get_tenant(trial.tenant)
        assert tenant is not None
        quota = StorageQuota.of(tenant)
        spec = ExperimentSpec.model_validate(repo.experiment_of(trial.id).spec)
        kept = repo.list_checkpoints(trial.id)
        incoming = Checkpoint(-1, trial.id, "", step, 0, metrics, "", 0, 0.0)
        dropped = retention_victims([*kept, incoming], spec)
        # what the trial's nodes measured in its folders counts too (issue 24)
        trial_used = trial.disk_bytes + sum(c.size_bytes for c in kept if c.id not in dropped)
        tenant_used = (
            repo.checkpoint_bytes_by_tenant().get(trial.tenant, 0)
            + repo.disk_bytes_by_tenant().get(trial.tenant, 0)
            - sum(c.size_bytes for c in kept if c.id in dropped)
        )
        tenant_used += self.other_bytes(trial.tenant)
        limits_left = [
            (quota.max_checkpoint_bytes, "the checkpoint size limit", quota.max_checkpoint_bytes),
            (
                quota.max_trial_storage_bytes - trial_used,
                "the trial's storage quota",
                quota.max_trial_storage_bytes,
            ),
            (
                quota.max_storage_bytes - tenant_used,
                f"tenant {trial.tenant!r}'s storage quota",
                quota.max_storage_bytes,
            ),
        ]
        left, name, total = min(limits_left, key=lambda item: item[0])
        left = max(0, left)

        def error(size: int) -> Exception:
            message = (
                f"a checkpoint of {_gib(size)} does not fit in {name} of {_gib(total)} "
                f"({_gib(left)} left)"
            )
            hint = "save a smaller state, keep fewer checkpoints, or ask an admin to raise it"
            if name == "the checkpoint size limit":
                return TooLarge(message, hint)
            return QuotaExceeded(message, hint)

        return left, error

    def open_checkpoint_writer(self, upload: CheckpointUpload) -> BlobWriter:
        """Where the upload's bytes go, chunk by chunk, before any transaction opens."""
        return self.store.open_writer(upload.storage_key)

    def finish_checkpoint(
        self, principal: Principal, upload: CheckpointUpload, writer: BlobWriter
    ) -> Checkpoint:
        """Register a streamed checkpoint (re-checking the trial and quotas); the writer is
        committed here or aborted when anything is refused."""
        now = self.clock()
        try:
            with self.uow() as repo:
                trial = _writable_trial(
                    repo, principal, upload.trial_id, upload.attempt, "checkpoints", now
                )
                existing = repo.get_checkpoint_by_uuid(upload.uuid)
                if existing is not None:
                    writer.abort()  # a concurrent retry registered it first
                    return existing
                left, error = self._room(repo, trial, upload.step, upload.metrics)
                if writer.size > left:
                    raise error(writer.size)
                size = writer.commit()
                checkpoint = repo.add_checkpoint(
                    upload.trial_id,
                    upload.uuid,
                    upload.step,
                    upload.attempt,
                    upload.metrics,
                    upload.storage_key,
                    size,
                    now,
                )
                repo.add_event(
                    upload.trial_id,
                    "checkpoint",
                    f"checkpoint {checkpoint.id} at step {upload.step}",
                    now,
                )
                spec = ExperimentSpec.model_validate(repo.experiment_of(upload.trial_id).spec)
                self._apply_retention(repo, upload.trial_id, spec)
                return checkpoint
        except BaseException:
            writer.abort()
            raise

    def register_checkpoint_set(
        self,
        principal: Principal,
        upload: CheckpointUpload,
        prefix: str,
        size: int,
        publish: Callable[[], object],
    ) -> Checkpoint:
        """Register a sharded checkpoint whose members are stored (ADR 0040): the trial and
        the quotas are checked again for the members' ``size``, then ``publish`` writes the
        manifest (it raises when a member is missing) and the row is added, in one
        transaction: a set the database lists has its manifest."""
        now = self.clock()
        with self.uow() as repo:
            trial = _writable_trial(
                repo, principal, upload.trial_id, upload.attempt, "checkpoints", now
            )
            existing = repo.get_checkpoint_by_uuid(upload.uuid)
            if existing is not None:
                return existing
            left, error = self._room(repo, trial, upload.step, upload.metrics)
            if size > left:
                raise error(size)
            publish()
            checkpoint = repo.add_checkpoint(
                upload.trial_id,
                upload.uuid,
                upload.step,
                upload.attempt,
                upload.metrics,
                prefix,
                size,
                now,
            )
            repo.add_event(
                upload.trial_id,
                "checkpoint",
                f"sharded checkpoint {checkpoint.id} at step {upload.step}",
                now,
            )
            spec = ExperimentSpec.model_validate(repo.experiment_of(upload.trial_id).spec)
            self._apply_retention(repo, upload.trial_id, spec)
            return checkpoint

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
        """Register a checkpoint given whole (small ones; the API streams instead)."""
        upload = self.begin_checkpoint(principal, trial_id, uuid, step, attempt, metrics, len(data))
        if isinstance(upload, Checkpoint):
            return upload
        writer = self.open_checkpoint_writer(upload)
        writer.write(data)
        return self.finish_checkpoint(principal, upload, writer)

    def _apply_retention(self, repo: Repository, trial_id: int, spec: ExperimentSpec) -> None:
        for checkpoint_id in retention_victims(repo.list_checkpoints(trial_id), spec):
            checkpoint = repo.get_checkpoint(checkpoint_id)
            assert checkpoint is not None
            repo.mark_checkpoint_deleted(checkpoint_id)
            delete_checkpoint_blobs(self.store, checkpoint.storage_key)

    def list_checkpoints(self, principal: Principal, trial_id: int) -> list[Checkpoint]:
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            return repo.list_checkpoints(trial_id)

    def checkpoint_chunks(
        self, principal: Principal, trial_id: int, checkpoint_id: int
    ) -> tuple[Checkpoint, Iterator[bytes]]:
        """A checkpoint and its bytes in chunks (for streaming downloads)."""
        checkpoint = self.readable_checkpoint(principal, trial_id, checkpoint_id)
        refuse_set(checkpoint)
        return checkpoint, self.store.iter_chunks(checkpoint.storage_key)

    def readable_checkpoint(
        self, principal: Principal, trial_id: int, checkpoint_id: int
    ) -> Checkpoint:
        """A checkpoint the caller may read through trial ``trial_id``: the trial's own, or
        the one an attempt of it restores (PBT, clone); NotFound otherwise."""
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
            checkpoint = repo.get_checkpoint(checkpoint_id)
            # a trial may read its own checkpoints and the one it warm-starts from (PBT, clone)
            restores = checkpoint is not None and any(
                a.restored_checkpoint_id == checkpoint_id for a in repo.list_attempts(trial_id)
            )
            if checkpoint is None or (checkpoint.trial_id != trial_id and not restores):
                raise NotFound(f"checkpoint {checkpoint_id} of trial {trial_id} does not exist")
        return checkpoint

    def checkpoint_data(self, principal: Principal, trial_id: int, checkpoint_id: int) -> bytes:
        _, chunks = self.checkpoint_chunks(principal, trial_id, checkpoint_id)
        return b"".join(chunks)

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
