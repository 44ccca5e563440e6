"""experiments: the best value of the searcher's metric for experiments that reported metrics
before 0011 (until now they got it only at their next report, so the list sorted them last)

Revision ID: 0012
Revises: 0011
"""

import json
import math
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_experiments = sa.table(
    "experiments",
    sa.column("id", sa.Integer),
    sa.column("spec", sa.JSON),
    sa.column("best_value", sa.Float),
    sa.column("best_rank", sa.Float),
)
_trials = sa.table("trials", sa.column("id", sa.Integer), sa.column("experiment_id", sa.Integer))
_metrics = sa.table("metrics", sa.column("trial_id", sa.Integer), sa.column("values", sa.JSON))


def _searcher(spec: Any) -> tuple[str, str] | None:
    if isinstance(spec, str):  # a JSON column read through a plain table may come as text
        spec = json.loads(spec)
    searcher = spec.get("searcher") if isinstance(spec, dict) else None
    if not isinstance(searcher, dict) or not isinstance(searcher.get("metric"), str):
        return None
    return searcher["metric"], "min" if searcher.get("mode") == "min" else "max"


def upgrade() -> None:
    bind = op.get_bind()
    missing = bind.execute(
        sa.select(_experiments.c.id, _experiments.c.spec).where(_experiments.c.best_rank.is_(None))
    ).all()
    for experiment_id, spec in missing:
        searcher = _searcher(spec)
        if searcher is None:
            continue
        metric, mode = searcher
        rows = bind.execute(
            sa.select(_metrics.c["values"])
            .join(_trials, _trials.c.id == _metrics.c.trial_id)
            .where(_trials.c.experiment_id == experiment_id)
            .execution_options(yield_per=10_000)
        )
        best: float | None = None
        for (stored,) in rows:
            values = json.loads(stored) if isinstance(stored, str) else stored
            value = values.get(metric) if isinstance(values, dict) else None
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                continue
            if best is None or (value < best if mode == "min" else value > best):
                best = float(value)
        if best is not None:
            bind.execute(
                sa.update(_experiments)
                .where(_experiments.c.id == experiment_id)
                .values(best_value=best, best_rank=best if mode == "min" else -best)
            )


def downgrade() -> None:
    pass  # the values stay right under 0011's schema
