"""Interactive sessions (pure): the spec's ``session`` section, the limits a tenant sets on
sessions, and the idle verdict.

A session is a trial of kind notebook, shell or tensorboard: an experiment whose spec carries a
``session`` section and whose entrypoint the platform writes (``trainhub.runtime.session_server``
starts JupyterLab or TensorBoard on a unix socket the control plane's proxy reaches). The
scheduler queues and places it like any trial; these rules decide what a user may ask for and
when an idle session ends (docs/sessions.md, ADR 0035).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core.errors import FieldError

MIN_IDLE_TIMEOUT_S = 5.0
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
# how often the control plane asks a running session how long it has been idle; a session
# ends at most this long (plus one tick) after its idle timeout passed: the "+ 30 s"
IDLE_CHECK_INTERVAL_S = 10.0
MAX_TENSORBOARD_TRIALS = 64
SESSION_PROJECT = "sessions"  # the project of the experiment a session is
# the secret the notebook server requires (its token); never stored, never in the spec
SECRET_ENV = "TRAINHUB_SESSION_SECRET"
KIND_ENV = "TRAINHUB_SESSION_KIND"
BASE_URL_ENV = "TRAINHUB_SESSION_BASE_URL"
SOCKET_NAME = "session.sock"  # in the attempt's spool folder (TRAINHUB_SPOOL_DIR)
LOGDIR_NAME = "tensorboard"  # the folder of event files in a tensorboard session's context
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SessionKind(StrEnum):
    NOTEBOOK = "notebook"  # JupyterLab (kernels, files, terminals)
    SHELL = "shell"  # the same server; the client opens a terminal of it
    TENSORBOARD = "tensorboard"  # TensorBoard over event files of trials


class SessionSpec(BaseModel):
    """The ``session`` section of a spec: what kind of interactive server the trial runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: SessionKind = Field(SessionKind.NOTEBOOK, description="notebook | shell | tensorboard")
    idle_timeout_s: Annotated[
        float,
        Field(
            ge=MIN_IDLE_TIMEOUT_S,
            le=MAX_IDLE_TIMEOUT_S,
            description="Seconds without kernel activity and without an open connection after "
            "which the session ends and frees its GPUs (its home folder is kept).",
        ),
    ] = DEFAULT_IDLE_TIMEOUT_S
    trials: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        max_length=MAX_TENSORBOARD_TRIALS,
        description="tensorboard: the trials whose metrics it shows.",
    )


def parse_duration(text: str, field: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` in seconds; ValueError naming ``field``."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{field}: {text!r} is not a duration; write e.g. 30m, 2h or 90s")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


@dataclass(frozen=True)
class SessionLimits:
    """What an admin allows one session of a tenant (None: no limit of its own)."""

    max_gpus: int | None = None  # GPUs of one session
    max_length_s: float | None = None  # a session's run time; it ends after this

    def describe(self) -> str:
        gpus = "any" if self.max_gpus is None else str(self.max_gpus)
        length = "none" if self.max_length_s is None else f"{self.max_length_s:g} s"
        return f"GPUs per session: {gpus}; longest session: {length}"


def gpu_errors(
    gpus: int, limits: SessionLimits, tenant_limit_slots: int | None
) -> list[FieldError]:
    """Why a session of ``gpus`` GPUs can never run for this tenant (empty: it may)."""
    errors = []
    if limits.max_gpus is not None and gpus > limits.max_gpus:
        errors.append(
            FieldError(
                "gpus",
                f"{gpus} GPUs asked; sessions of this tenant may hold at most {limits.max_gpus}",
                "ask for fewer, or ask a tenant admin to raise the limit "
                "(trainhub tenants session-limits)",
            )
        )
    if tenant_limit_slots is not None and gpus > tenant_limit_slots:
        errors.append(
            FieldError(
                "gpus",
                f"{gpus} GPUs asked; the tenant may never hold more than {tenant_limit_slots}",
                "ask for fewer",
            )
        )
    return errors


@dataclass(frozen=True)
class Activity:
    """What the control plane knows of a running session's use, at one moment."""

    started_at: float  # the session's attempt started
    last_activity_at: float | None  # the server's last kernel or API activity, or a proxied request
    open_connections: int  # WebSocket connections through the proxy, and kernels' clients


@dataclass(frozen=True)
class IdleVerdict:
    idle_s: float
    cull: bool
    reason: str = ""


def idle_verdict(
    activity: Activity,
    idle_timeout_s: float,
    now: float,
    max_length_s: float | None = None,
) -> IdleVerdict:
    """Whether a running session ends now: idle for its timeout, or longer than allowed."""
    last = max(activity.started_at, activity.last_activity_at or activity.started_at)
    idle_s = 0.0 if activity.open_connections > 0 else max(0.0, now - last)
    if max_length_s is not None and now - activity.started_at >= max_length_s:
        return IdleVerdict(
            idle_s, True, f"ran for the tenant's longest session ({max_length_s:g} s)"
        )
    if idle_s >= idle_timeout_s:
        return IdleVerdict(
            idle_s,
            True,
            f"idle for {idle_s:.0f} s (no kernel activity and no open connection; "
            f"timeout {idle_timeout_s:g} s)",
        )
    return IdleVerdict(idle_s, False)
