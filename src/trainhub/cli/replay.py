"""``trainhub sim --replay DB_URL``: the server's own history through the simulator.

The reading is in :mod:`trainhub.service.replay`; this module opens the database (SQLite path
or URL, PostgreSQL URL) without changing it and turns the options into a replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainhub.core.errors import InvalidRequest
from trainhub.service.replay import ReplayReport, read_history, replay
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig


def parse_guarantees(items: Sequence[str]) -> dict[str, int]:
    """``TENANT=SLOTS`` items, e.g. ``vision=8``."""
    parsed: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise InvalidRequest(
                f"--guarantee {item!r} is not TENANT=SLOTS", "write it like --guarantee vision=8"
            )
        parsed[name.strip()] = int(value)
    return parsed


def database_url(text: str) -> str:
    """A SQLAlchemy URL; a plain path means a SQLite file."""
    return text if "://" in text else f"sqlite:///{text}"


def replay_database(
    url: str,
    cluster: ClusterSpec,
    policies: Sequence[str],
    *,
    guarantees: Sequence[str] = (),
    sim: SimConfig | None = None,
    actual_slots: int | None = None,
    since: float | None = None,
) -> ReplayReport:
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from trainhub.adapters.db import SqlUnitOfWork, make_engine

    overrides = parse_guarantees(guarantees)
    parsed = make_url(database_url(url))
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        # SQLite would create an empty file there: say what is missing instead
        raise InvalidRequest(
            f"there is no database file at {parsed.database}",
            "pass the server's database: a SQLite file (default ~/.trainhub/trainhub.db) or "
            "its postgresql:// URL",
        )
    engine = make_engine(parsed.render_as_string(hide_password=False))
    try:
        try:
            tables = set(inspect(engine).get_table_names())
        except DBAPIError as exc:
            first = str(exc.orig or exc).strip().splitlines()[0]
            raise InvalidRequest(
                f"cannot open the database at {parsed.render_as_string()}: {first}",
                "check the URL, the user and that the server is reachable",
            ) from None
        if not {"experiments", "trials", "attempts"} <= tables:
            raise InvalidRequest(
                f"{parsed.render_as_string()} is not a trainhub database (no experiments, "
                "trials and attempts tables)",
                "pass the database a trainhub server writes (--db of `trainhub server`)",
            )
        columns = {c["name"] for c in inspect(engine).get_columns("trials")}
        if "run_time_s" not in columns:
            raise InvalidRequest(
                f"the database at {url} has no recorded run times (its schema is older)",
                "start the server of that database once with this version to upgrade it",
            )
        history = read_history(SqlUnitOfWork(engine), since)
    finally:
        engine.dispose()
    if not history.trials:
        raise InvalidRequest(
            f"the database at {url} holds no trial that ran and ended"
            + (f" ({history.skipped} others never ran or still run)" if history.skipped else ""),
            "replay a server database with finished trials",
        )
    return replay(
        history, cluster, policies, guarantees=overrides, sim=sim, actual_slots=actual_slots
    )
