"""Every bound on what a user may send, written once.

A request beyond one of these is refused with a 4xx whose message names the bound, before
anything is stored or expanded (docs/adr/0008-every-input-bounded.md). Storage quotas
(checkpoint size, storage per trial and per tenant) are per tenant and set by admins; the
defaults below apply where an admin set none.
"""

from __future__ import annotations

import math
from typing import Any

from trainhub.core.errors import FieldError

# integers: ids, steps, attempts, offsets are 64-bit signed (what SQLite and PostgreSQL hold)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# the experiment spec (YAML text)
MAX_SPEC_BYTES = 64 * 1024
MAX_SPEC_DEPTH = 32  # nesting of mappings and sequences, aliases expanded
# nodes plus characters of scalars once every alias is expanded: a spec that expands past
# this is refused before it is built (a "billion laughs" document is a few hundred bytes)
MAX_SPEC_EXPANDED_UNITS = 4 * MAX_SPEC_BYTES
MAX_INT_DIGITS = 20  # a longer integer literal cannot fit in 64 bits
MAX_ENTRYPOINT_CHARS = 4096
MAX_DESCRIPTION_CHARS = 4096
MAX_ENV_VARIABLES = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_CHARS = 32 * 1024
# a trial environment's request (environment.requirements / environment.packages)
MAX_REQUIREMENTS = 200  # lines of one request
MAX_REQUIREMENT_CHARS = 500
MAX_REQUIREMENTS_FILE_BYTES = 64 * 1024
MAX_REQUIREMENTS_PATH_CHARS = 1024
MAX_HYPERPARAMETERS = 1000
MAX_SPEC_CHANGES = 100  # PATH=VALUE changes of one clone
MAX_NODE_LABELS = 64
MAX_LABEL_CHARS = 256
MIN_CPUS_PER_WORKER = 0.01  # Ray accounts resources in 1/10,000ths; below 0.01 is a typo
MAX_MEMORY_GB_PER_WORKER = 100_000.0
MAX_DISTILL_HINTS = 16  # FitNet hint pairs in a spec's distill section
MAX_LAYER_NAME_CHARS = 200  # a module path such as blocks.3.conv1
MAX_DISTILL_TEMPERATURE = 100.0

# metrics (the names are also checked by the runtime, from the wire contract)
MAX_METRIC_NAME_CHARS = 128
METRIC_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,127}$"
MAX_METRICS_PER_POINT = 256
MAX_METRIC_NAMES_PER_TRIAL = 1000
MAX_POINTS_PER_REQUEST = 1000

# training dynamics of samples (ctx.track_samples; docs/debugging.md)
MAX_SAMPLE_RECORDS_PER_REQUEST = 10_000  # the runtime sends at most 4,096 per request
MAX_SAMPLE_RECORDS_PER_TRIAL = 2_000_000  # e.g. 100,000 samples for 20 epochs
MAX_SAMPLE_EPOCH = 1_000_000
MAX_SAMPLE_CLASSES = 10_000  # labels are stored as int16
MAX_SAMPLE_SOURCE_CHARS = 128  # the dataset name a trial's records come from
MAX_DEBUG_TOP = 1000  # suspicious samples listed by one request
MAX_DEBUG_PNG_SAMPLES = 100  # images in one PNG grid
# samples a clone drops or relabels: they travel in one environment variable
MAX_FILTERED_SAMPLES = 4000

# request bodies: JSON bodies and form fields; uploads have their own limits. A JSON body
# costs the server about 15x its size once parsed: 1 MiB of metrics is ~15 MB for a moment
MAX_JSON_BODY_BYTES = 1024 * 1024
MAX_METRICS_BODY_BYTES = 1024 * 1024  # the runtime splits its batches to stay under this

# what a trial writes besides the API's checkpoints (issue 24; docs/security.md). Metric
# points: per trial per minute (over it: 429 with Retry-After, the runtime waits and sends
# again) and in all (points past it are dropped and counted). A point is one step's values.
MAX_METRIC_POINTS_PER_MINUTE = 6_000
MAX_METRIC_POINTS_PER_TRIAL = 1_000_000
# each attempt's output, per trial (split evenly over its ranks): past it a rank's stored log
# keeps its first quarter and its latest lines, with a marker saying how much was dropped
DEFAULT_MAX_LOG_BYTES_PER_TRIAL = 64 * 1024**2
MIN_LOG_BYTES_PER_RANK = 64 * 1024
# the bytes of a trial's checkpoint folder, home and scratch (counted with the API's
# checkpoints against the trial's and the tenant's storage quotas) are measured on its nodes
# at most this often, and once more when an attempt ends
DISK_MEASURE_INTERVAL_S = 10.0
MAX_DISK_MEASURE_ENTRIES = 200_000  # files one measurement walks before it stops (and says so)

# storage quotas (defaults where the tenant's admin set none)
DEFAULT_MAX_CHECKPOINT_BYTES = 16 * 1024**3
DEFAULT_MAX_TRIAL_STORAGE_BYTES = 64 * 1024**3
DEFAULT_MAX_TENANT_STORAGE_BYTES = 1024**4

# the dashboard's live updates (server-sent events): streams open at once per browser session
# and in all, how long one stream lasts before the browser reconnects (each reconnect checks
# the session again), and a comment line sent at least this often so proxies keep it open
MAX_LIVE_STREAMS_PER_SESSION = 6
MAX_LIVE_STREAMS = 200
LIVE_STREAM_MAX_S = 300.0
LIVE_HEARTBEAT_S = 15.0

# profiling a running trial (trainhub profile): steps per request, the operators kept per rank,
# and one rank's trace file (gzip-compressed Chrome trace JSON)
MAX_PROFILE_STEPS = 500
MAX_PROFILE_OPS = 50
MAX_PROFILE_OP_NAME_CHARS = 512
MAX_PROFILE_TRACE_BYTES = 64 * 1024 * 1024

# failed authentication: this many per key (client address, presented token prefix,
# principal) in a window, then its failures get 429 until it ends; a valid token always
# passes, and the cluster's own node addresses are never limited as a whole (api/failed_auth)
MAX_FAILED_AUTH_PER_WINDOW = 20
FAILED_AUTH_WINDOW_S = 60.0
MAX_FAILED_AUTH_KEYS = 30_000  # keys the limiter remembers (least recently failing forgotten)
NODE_ADDRESSES_REFRESH_S = 30.0  # how often the node addresses are read again from Ray


def check_plain_values(data: Any, path: str = "") -> list[FieldError]:
    """Integers that do not fit in 64 bits and non-finite floats, with their field paths.

    ``data`` is what YAML or JSON gave (dicts, lists, scalars), already bounded in depth.
    """
    errors: list[FieldError] = []
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            errors.append(FieldError(where, "integer out of range", "integers must fit in 64 bits"))
        elif isinstance(value, float) and not math.isfinite(value):
            errors.append(
                FieldError(where, f"{value} is not a finite number", "use a finite number")
            )
        elif isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}.{i}" if where else str(i), v) for i, v in enumerate(value))
    return sorted(errors, key=lambda e: e.path)


# the model registry and the spec's model section
MAX_MODEL_NAME_CHARS = 64
MAX_MODEL_PATTERNS = 256  # freeze / reset globs
MAX_MODEL_PATTERN_CHARS = 256
MAX_MODEL_ARCH_ARGS = 64
MAX_MODEL_DESCRIPTION_CHARS = 4096
MAX_MODELS_LISTED = 500
MAX_MODEL_SHARES = 256  # tenants one model is shared with
MAX_GROW_LAYERS = 64
MAX_GROW_FACTOR = 16.0  # Net2WiderNet (trainhub.models.net2net) takes 1 < factor <= 16

# the experiments list (API, page, CLI): filters and sort
MAX_LIST_FILTER_CHARS = 64  # tenant, project, user and name filters
EXPERIMENT_SORTS = ("created", "name", "best")
SORT_ORDERS = ("asc", "desc")

# tenant datasets (trainhub data push) and the spec's data section
MAX_DATASET_NAME_CHARS = 64
MAX_DATA_MOUNTS = 16  # datasets one trial mounts
MAX_MOUNT_PATH_CHARS = 1024
MAX_DATASETS_LISTED = 500
MAX_DATASET_SHARES = 256
