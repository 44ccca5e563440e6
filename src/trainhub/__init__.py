"""trainhub: deep-learning training as a service for a shared GPU cluster.

Importing ``trainhub`` is cheap and has no side effects. A training script uses the runtime::

    import trainhub
    ctx = trainhub.init()

``trainhub.init``, ``trainhub.Context`` and ``trainhub.data`` are loaded lazily from :mod:`trainhub.runtime`, so the
server side (FastAPI, SQLAlchemy, Ray) is never imported by user scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from trainhub import data
    from trainhub.runtime import Context, init

__all__ = ["Context", "__version__", "data", "init"]


def __getattr__(name: str) -> Any:
    if name in ("init", "Context"):
        from trainhub import runtime

        return getattr(runtime, name)
    if name == "data":  # ``trainhub.data.load(...)`` after a plain ``import trainhub``
        import importlib

        return importlib.import_module("trainhub.data")
    raise AttributeError(f"module 'trainhub' has no attribute {name!r}")
