"""trainhub: deep-learning training as a service for a shared GPU cluster.

Importing ``trainhub`` is cheap and has no side effects. A training script uses the runtime::

    import trainhub
    ctx = trainhub.init()

``trainhub.init`` and ``trainhub.Context`` (from :mod:`trainhub.runtime`), ``trainhub.data``
and ``trainhub.models`` are loaded lazily, on first use, so the server side (FastAPI,
SQLAlchemy, Ray) is never imported by user scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from trainhub import data, models
    from trainhub.runtime import Context, init

__all__ = ["Context", "__version__", "data", "init", "models"]


def __getattr__(name: str) -> Any:
    if name in ("init", "Context"):
        from trainhub import runtime

        return getattr(runtime, name)
    if name in ("data", "models"):  # ``trainhub.data.load(...)`` after ``import trainhub``
        import importlib

        return importlib.import_module(f"trainhub.{name}")
    raise AttributeError(f"module 'trainhub' has no attribute {name!r}")
