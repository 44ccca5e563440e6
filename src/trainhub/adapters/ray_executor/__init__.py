"""The Ray executor adapter: runs trial attempts as placement groups of detached rank actors.

``RayExecutor`` (imports Ray) is loaded lazily so that importing this package stays cheap;
``ensure_local_ray`` / ``stop_local_ray`` manage a local head for the embedded deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainhub.adapters.ray_executor.local_cluster import (
    LocalRayError,
    ensure_local_ray,
    stop_local_ray,
)

if TYPE_CHECKING:
    from trainhub.adapters.ray_executor.executor import ExecutorUnavailable, RayExecutor

__all__ = [
    "ExecutorUnavailable",
    "LocalRayError",
    "RayExecutor",
    "ensure_local_ray",
    "stop_local_ray",
]


def __getattr__(name: str) -> Any:
    if name in ("RayExecutor", "ExecutorUnavailable"):
        from trainhub.adapters.ray_executor import executor

        return getattr(executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
