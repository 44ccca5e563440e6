"""The wire contract between a training process (the runtime) and the control plane.

This module is the only thing the runtime and the server share. It holds names and plain
payload shapes, no behaviour: environment variables the executor sets for every rank, and the
HTTP routes (all under ``/api/v1``, authenticated with ``Authorization: Bearer $TRAINHUB_TOKEN``,
a token scoped to one trial) the runtime calls.
"""

from __future__ import annotations

from typing import Any, TypedDict

# --- environment set for every rank (besides torchrun's RANK, LOCAL_RANK, WORLD_SIZE,
# LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK) ---
ENV_API_URL = "TRAINHUB_API_URL"  # e.g. http://10.0.0.1:8080
ENV_TOKEN = "TRAINHUB_TOKEN"  # bearer token valid for this trial only
ENV_TRIAL_ID = "TRAINHUB_TRIAL_ID"
ENV_EXPERIMENT_ID = "TRAINHUB_EXPERIMENT_ID"
ENV_ATTEMPT = "TRAINHUB_ATTEMPT"  # 1 for the first run of a trial, 2 after a restart, ...
ENV_HPARAMS = "TRAINHUB_HPARAMS"  # JSON object of hyperparameters
ENV_RESTORE_CHECKPOINT = "TRAINHUB_RESTORE_CHECKPOINT"  # checkpoint id to restore, or unset
ENV_DISTRIBUTED = "TRAINHUB_DISTRIBUTED"  # JSON of the spec's distributed section, if any
ENV_DISTILL = "TRAINHUB_DISTILL"  # JSON of the spec's distill section, if any
ENV_SPOOL_DIR = "TRAINHUB_SPOOL_DIR"  # node-local scratch directory of this attempt
# an interactive session (trainhub.runtime.session_server; the same names as
# trainhub.core.session_spec): its kind, the secret its server requires, the path prefix the
# control plane's proxy serves it under
ENV_SESSION_KIND = "TRAINHUB_SESSION_KIND"
ENV_SESSION_SECRET = "TRAINHUB_SESSION_SECRET"
ENV_SESSION_BASE_URL = "TRAINHUB_SESSION_BASE_URL"
SESSION_SOCKET_NAME = "session.sock"  # in ENV_SPOOL_DIR
# the communication hooks' cumulative counts of one rank, {"wire_bytes", "payload_bytes"}, in
# ENV_SPOOL_DIR: the rank actor ships them with the kernel's counters (docs/adr/0045)
COMM_COUNTS_FILE = "comm-rank{rank}.json"
ENV_MODEL = "TRAINHUB_MODEL"  # JSON of the spec's model section (init_from pinned), if any
# JSON {"drop": [sample ids], "relabel": {"id": label}} from `trainhub clone --drop-flagged`:
# the runtime's data loaders leave out or relabel these samples (runtime/sample_filter.py)
ENV_SAMPLE_FILTER = "TRAINHUB_SAMPLE_FILTER"
# the searcher's metric of a search or PBT trial: after a report that holds it, rank 0's next
# should_stop() waits (briefly) for the reply to that report, which carries the prune decision
ENV_SEARCHER_METRIC = "TRAINHUB_SEARCHER_METRIC"
# JSON {"launched_at": t, "actor_at": t, "spawned_at": t, "warm": bool}: when the control plane
# handed the attempt over, when the rank's actor ran and spawned the rank (trainhub.core.startup)
ENV_STARTUP_MARKS = "TRAINHUB_STARTUP_MARKS"

# exit code of a rank that found the spec and the script at odds (a model.freeze pattern that
# matches no layer, a shape mismatch outside model.reset, a distill hint naming no layer): another
# attempt would fail the same way, so the control plane does not restart the trial (EX_CONFIG)
EXIT_SPEC_REFUSED = 78

# --- optional tuning of the runtime (the executor may set them; the runtime has defaults) ---
ENV_FLUSH_TIMEOUT_S = "TRAINHUB_FLUSH_TIMEOUT_S"  # how long close() keeps retrying; default 600
ENV_METRICS_BATCH_S = "TRAINHUB_METRICS_BATCH_S"  # how long points wait to form a batch; default 1
ENV_SIGNALS_POLL_S = "TRAINHUB_SIGNALS_POLL_S"  # how often rank 0 asks for signals; default 5
# how long should_stop() waits for the reply to a report of the searcher metric; default 5
ENV_STOP_CHECK_TIMEOUT_S = "TRAINHUB_STOP_CHECK_TIMEOUT_S"

API_PREFIX = "/api/v1"

# --- bounds the control plane enforces on what the runtime sends (trainhub.core.limits holds
# the same numbers; a test keeps them equal) ---
METRIC_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,127}$"  # 1-128 chars
MAX_METRICS_PER_POINT = 256
MAX_POINTS_PER_REQUEST = 1000
MAX_METRICS_BODY_BYTES = 1024 * 1024
MAX_SAMPLE_RECORDS_PER_REQUEST = 10_000
MAX_SAMPLE_CLASSES = 10_000


def metrics_path(trial_id: int) -> str:
    """POST a :class:`MetricsBatch`; answers :class:`Signals` (200): a stop request (prune,
    PBT replacement, pause, preemption, cancel) rides on the reply, and a prune the searcher
    decides on the batch's values is decided before the reply. Idempotent: a step reported
    again replaces values. (A 204 without a body, from an older server, says nothing.)"""
    return f"{API_PREFIX}/trials/{trial_id}/metrics"


def checkpoints_path(trial_id: int) -> str:
    """POST the checkpoint file as the raw request body (``application/octet-stream``) with
    query parameters ``uuid`` (chosen by the runtime; a retry with the same uuid registers
    nothing twice), ``step``, ``attempt`` and ``metrics`` (a JSON object). Answers
    :class:`CheckpointRecord`."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints"


def checkpoint_file_path(trial_id: int, checkpoint_id: int) -> str:
    """GET the bytes of a checkpoint."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/{checkpoint_id}/file"


def direct_checkpoint_path(trial_id: int) -> str:
    """POST ``{uuid, step, attempt, metrics, size_bytes}``: presigned PUT URLs of the
    checkpoint's parts (``route: direct``), ``route: control-plane`` (POST the bytes to
    :func:`checkpoints_path` instead), or ``route: stored`` (this uuid is registered). Asked
    again, it refreshes the URLs and lists the parts already stored (ADR 0033)."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/direct"


def direct_checkpoint_complete_path(trial_id: int) -> str:
    """POST the same fields and ``upload_id`` once every part is sent: answers
    :class:`CheckpointRecord` (201)."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/direct/complete"


def direct_checkpoint_file_path(trial_id: int, checkpoint_id: int) -> str:
    """GET a presigned URL of a checkpoint's bytes (``route: direct``, ``url``,
    ``size_bytes``) or ``route: control-plane`` (GET :func:`checkpoint_file_path`)."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/{checkpoint_id}/direct"


def set_member_path(trial_id: int, uuid: str, name: str) -> str:
    """PUT one file of a sharded checkpoint (raw body; query ``step``, ``attempt``); POST
    ``.../direct`` ``{step, attempt, size_bytes}`` for presigned part URLs instead, then
    ``.../direct/complete`` with ``upload_id`` (ADR 0040)."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/sets/{uuid}/members/{name}"


def set_rank_path(trial_id: int, uuid: str, rank: int) -> str:
    """POST what a rank stored of a sharded checkpoint (``world_size``, ``step``, ``attempt``,
    ``metrics``, ``members``: name, size, sha256); the last rank's report publishes it."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/sets/{uuid}/ranks/{rank}"


def checkpoint_manifest_path(trial_id: int, checkpoint_id: int) -> str:
    """GET ``{sharded, members, meta}`` of a checkpoint."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/{checkpoint_id}/manifest"


def checkpoint_member_path(trial_id: int, checkpoint_id: int, name: str) -> str:
    """GET one file of a sharded checkpoint (``.../direct``: a presigned URL of it)."""
    return f"{API_PREFIX}/trials/{trial_id}/checkpoints/{checkpoint_id}/members/{name}"


def init_weights_path(trial_id: int) -> str:
    """GET the weights the trial starts from (the checkpoint file its ``model.init_from``
    names); read by ``ctx.init_model``."""
    return f"{API_PREFIX}/trials/{trial_id}/init-weights"


def startup_path(trial_id: int) -> str:
    """POST a :class:`StartupReport` (rank 0, once per attempt, after its first optimizer
    step); 204. The control plane turns it into the attempt's startup phases."""
    return f"{API_PREFIX}/trials/{trial_id}/startup"


def samples_path(trial_id: int) -> str:
    """POST a :class:`SampleRecordsBatch`; 204. Idempotent: a retry with the same uuid stores
    nothing twice."""
    return f"{API_PREFIX}/trials/{trial_id}/samples"


def teacher_weights_path(trial_id: int) -> str:
    """GET the weights of the teacher the trial's ``distill`` section names."""
    return f"{API_PREFIX}/trials/{trial_id}/teacher-weights"


def signals_path(trial_id: int) -> str:
    """GET a :class:`Signals`: whether the trial should checkpoint and stop, and why."""
    return f"{API_PREFIX}/trials/{trial_id}/signals"


class MetricPoint(TypedDict):
    step: int
    values: dict[str, float]
    time: float  # unix seconds when reported


class Progress(TypedDict):
    current: float
    total: float | None
    unit: str  # "epochs", "steps", ...


class MetricsBatch(TypedDict, total=False):
    attempt: int
    points: list[MetricPoint]
    progress: Progress


class SampleRecordsBatch(TypedDict):
    """Training dynamics of samples, one entry per sample and epoch, in columns."""

    attempt: int
    uuid: str  # chosen by the runtime; a retry with the same uuid stores nothing twice
    source: str | None  # the dataset the ids index, e.g. "mnist/t10k", "digits"
    num_classes: int
    ids: list[int]
    epochs: list[int]
    labels: list[int]  # the label trained with
    predictions: list[int]  # argmax of the logits
    margins: list[float]  # given label's logit - the largest other logit
    probs: list[float]  # softmax probability of the given label
    losses: list[float]  # cross-entropy of the given label


class CheckpointRecord(TypedDict):
    id: int
    uuid: str
    step: int
    metrics: dict[str, Any]


class Signals(TypedDict):
    should_stop: bool
    reason: str | None


# --- profiling (trainhub profile): every rank polls for a request, then uploads its result ---
ENV_PROFILE_POLL_S = "TRAINHUB_PROFILE_POLL_S"  # how often each rank asks; default 5


def profile_pending_path(trial_id: int) -> str:
    """GET ``{"profile": {"id", "steps", "attempt", ...} | null}``: the profile to run."""
    return f"{API_PREFIX}/trials/{trial_id}/profiles/pending"


def profile_rank_path(trial_id: int, profile_id: int, rank: int) -> str:
    """POST ``{"top_ops": [{"name", "calls", "self_cpu_ms", ...}]}``: one rank's table; then
    PUT ``.../trace`` with the gzip-compressed Chrome trace as the raw body."""
    return f"{API_PREFIX}/trials/{trial_id}/profiles/{profile_id}/ranks/{rank}"


class StartupReport(TypedDict):
    """Body of :func:`startup_path`: wall-clock timestamps (seconds since the epoch) of the
    marks of :data:`trainhub.core.startup.RANK_MARKS` this rank saw, and whether it came from a
    warm pool."""

    attempt: int
    marks: dict[str, float]
    warm: bool
