"""Tuning knobs of the runtime: batching, retries, polling, local file locations.

Defaults suit production. The executor may override three of them through the environment
(see :mod:`trainhub.runtime.protocol`); a script may pass ``options=`` or the shorthand keyword
arguments of :func:`trainhub.init`, which win over the environment.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhub.runtime import protocol


@dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime ships data; all durations in seconds.

    Attributes:
        flush_timeout_s: How long ``close()`` (and the exit hooks) keep retrying to deliver
            pending metrics and checkpoint uploads while the control plane is unreachable. Also
            bounds how long ``restore()`` retries a download.
        metrics_batch_s: A reported point waits at most this long before it is sent.
        metrics_batch_max_points: A batch is sent as soon as it holds this many points, and no
            request carries more.
        signals_poll_s: Rank 0 asks the control plane for signals (stop?) this often.
        stop_check_timeout_s: After a report of the searcher's metric, rank 0's next
            ``should_stop()`` waits at most this long for the reply to that report (which
            carries the prune decided on it); then the last answer holds.
        request_timeout_s: Timeout of one HTTP request (checkpoint transfers: per read/write).
        retry_initial_s: First back-off after a failed request; doubles up to ``retry_max_s``.
        retry_max_s: Longest back-off between two tries.
        metrics_file: Standalone mode: JSON lines of reported metrics are appended here.
        checkpoint_dir: Standalone mode: checkpoints are saved here as ``step-N.pt``.
        handle_sigterm: Install a SIGTERM handler (main thread, only where none is set) that
            exits through the normal shutdown path so pending data is flushed.
    """

    flush_timeout_s: float = 600.0
    metrics_batch_s: float = 1.0
    metrics_batch_max_points: int = 100
    signals_poll_s: float = 5.0
    stop_check_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 15.0
    metrics_file: Path = Path("trainhub-metrics.jsonl")
    checkpoint_dir: Path = Path("checkpoints")
    handle_sigterm: bool = True

    def __post_init__(self) -> None:
        for name in (
            "flush_timeout_s",
            "metrics_batch_s",
            "signals_poll_s",
            "stop_check_timeout_s",
            "request_timeout_s",
            "retry_initial_s",
            "retry_max_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"RuntimeOptions.{name} must be a finite number >= 0, got {value!r}"
                )
        if self.metrics_batch_max_points < 1:
            raise ValueError(
                "RuntimeOptions.metrics_batch_max_points must be >= 1, "
                f"got {self.metrics_batch_max_points!r}"
            )
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("RuntimeOptions.retry_max_s must be >= retry_initial_s")
        object.__setattr__(self, "metrics_file", Path(self.metrics_file))
        object.__setattr__(self, "checkpoint_dir", Path(self.checkpoint_dir))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeOptions:
        """Defaults, overridden by the ``TRAINHUB_*_S`` variables the executor may set."""
        env = os.environ if environ is None else environ
        overrides: dict[str, float] = {}
        for var, field in (
            (protocol.ENV_FLUSH_TIMEOUT_S, "flush_timeout_s"),
            (protocol.ENV_METRICS_BATCH_S, "metrics_batch_s"),
            (protocol.ENV_SIGNALS_POLL_S, "signals_poll_s"),
            (protocol.ENV_STOP_CHECK_TIMEOUT_S, "stop_check_timeout_s"),
        ):
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                overrides[field] = float(raw)
            except ValueError:
                raise ValueError(f"{var} must be a number of seconds, got {raw!r}") from None
        return cls(**overrides)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> RuntimeOptions:
        """A copy with some fields changed (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
