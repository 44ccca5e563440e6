"""Engines for SQLite (WAL) and PostgreSQL, and applying Alembic migrations at start."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def normalize_url(url: str) -> str:
    """Accept plain postgresql:// URLs and use psycopg 3 for them."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    kwargs: dict[str, Any] = {"future": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        # the API's worker threads (40) each hold a connection while they run: with fewer
        # pooled, the overflow ones were opened and closed (PRAGMAs and all) per request
        kwargs.update(pool_size=40, max_overflow=10)
    else:
        kwargs.update(pool_pre_ping=True, pool_size=10, max_overflow=10)
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        _queue_sqlite_writers(engine)
    return engine


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLAC")
_WRITER_KEY = "trainhub_writer"
_WRITER_WAIT_S = 30.0  # as PRAGMA busy_timeout


def _queue_sqlite_writers(engine: Engine) -> None:
    """Let this process's SQLite writers take turns on a lock instead of SQLite's busy loop.

    SQLite has one writer at a time; a writer that finds the database locked sleeps in its busy
    handler (1, 2, 5, ... 100 ms) and polls, so under many concurrent writers (20 runtimes
    reporting metrics) most of the time went to sleeping while the lock was free. A connection
    takes this lock at its first write statement (reads stay concurrent, as WAL allows) and
    gives it back when it returns to the pool, after its commit or rollback. Other processes
    on the same file still meet SQLite's busy handler; a lock not had in 30 s is gone without.
    """
    lock = threading.Lock()

    @event.listens_for(engine, "before_cursor_execute")
    def _take(
        conn: Any, _cursor: Any, statement: str, _params: Any, _ctx: Any, _many: bool
    ) -> None:
        if statement.lstrip()[:6].upper() in _WRITES and not conn.info.get(_WRITER_KEY):
            conn.info[_WRITER_KEY] = lock.acquire(timeout=_WRITER_WAIT_S)

    def _give_back(record: Any) -> None:
        if record is not None and record.info.pop(_WRITER_KEY, False):
            lock.release()

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        _give_back(record)

    @event.listens_for(engine, "invalidate")
    def _invalidate(_dbapi_conn: Any, record: Any, _exc: Any) -> None:
        _give_back(record)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
