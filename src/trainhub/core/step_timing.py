""" "Where the time goes" of a training step, from a trial's latest metrics: the step's phases
(``time/<phase>_share``, a fraction of ``time/step_s``) largest first with their milliseconds,
then the other profiling numbers (``time/*``, ``comm/*``, ``throughput/*``). The CLI's table and
the trial page's both show this."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainhub.core.layer_alerts import PREFIX as LAYER_PREFIX

PROFILING_PREFIXES = ("time/", "comm/", "throughput/")
# what the runtime reports by itself (step timing, communication, layer statistics): lists and
# charts show the script's own metrics first
RUNTIME_PREFIXES = (*PROFILING_PREFIXES, LAYER_PREFIX)


def is_runtime_metric(name: str) -> bool:
    return name.startswith(RUNTIME_PREFIXES)


@dataclass(frozen=True)
class Phase:
    name: str
    share: float  # of the step, as reported (not clamped)
    ms: float | None  # share of time/step_s, where the step's time is known

    @property
    def bar(self) -> float:
        """The share clamped to [0, 1], for a bar."""
        return max(0.0, min(1.0, self.share))


@dataclass(frozen=True)
class StepTiming:
    phases: list[Phase]  # largest share first
    others: list[tuple[str, Any]]  # the other profiling numbers, by name


def split_metrics(latest: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training metrics, profiling metrics named ``time/*``, ``comm/*``, ``throughput/*``)."""
    plain: dict[str, Any] = {}
    profiling: dict[str, Any] = {}
    for key, value in latest.items():
        if key == "step":
            continue
        (profiling if key.startswith(PROFILING_PREFIXES) else plain)[key] = value
    return plain, profiling


def _is_share(key: str) -> bool:
    return key.startswith("time/") and key.endswith("_share")


def step_timing(profiling: Mapping[str, Any]) -> StepTiming | None:
    """The phases and other numbers of ``profiling`` (as :func:`split_metrics` gives), or None
    where there are none."""
    if not profiling:
        return None
    step_s = profiling.get("time/step_s")
    known = step_s if isinstance(step_s, int | float) else None
    shares = {
        k[len("time/") : -len("_share")]: v
        for k, v in profiling.items()
        if _is_share(k) and isinstance(v, int | float)
    }
    phases = [
        Phase(name, share, share * known * 1000 if known is not None else None)
        for name, share in sorted(shares.items(), key=lambda kv: -kv[1])
    ]
    others = [(k, profiling[k]) for k in sorted(profiling) if not _is_share(k)]
    return StepTiming(phases, others)
