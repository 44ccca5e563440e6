"""The database adapter: SQLAlchemy 2 models, Alembic migrations and the repository."""

from trainhub.adapters.db.engine import make_engine, migrate
from trainhub.adapters.db.repository import SqlRepository, SqlUnitOfWork

__all__ = ["SqlRepository", "SqlUnitOfWork", "make_engine", "migrate"]
