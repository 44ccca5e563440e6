"""A chart's first read of a trial takes the packed chunks written at ingestion (not a row per
step) and draws what the rows hold; where chunks are missing it reads the rows."""

from __future__ import annotations

import math
from pathlib import Path

from sqlalchemy import delete

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api, build_api
from trainhub.adapters.db.models import MetricChunkRow
from trainhub.web.charts import ChartCache


def _rows_view(api: Api, token: str, trial_id: int) -> dict[str, list[tuple[float, float]]]:
    """What the metric rows hold, read as the API reads them."""
    principal = api.services.authenticate(token)
    out: dict[str, list[tuple[float, float]]] = {}
    for point in api.services.tracking.list_metrics(principal, trial_id, None, 100_000):
        for name, value in point.values.items():
            out.setdefault(name, []).append((float(point.step), value))
    return out


def _chart_view(
    cache: ChartCache, api: Api, token: str, trial_id: int, attempts: int
) -> dict[str, list[tuple[float, float]]]:
    chart = cache.chart(api.services.authenticate(token), trial_id, attempts, buckets=10_000)
    return {
        name: [(x, y) for x, y in zip(s["x"], s["y"], strict=True) if not math.isnan(y)]
        for name, s in chart["metrics"].items()
    }


def test_first_read_from_chunks_equals_the_rows(db_url: str, tmp_path: Path) -> None:
    api = build_api(db_url, tmp_path)
    try:
        token = api.user("alice", "vision")
        trial_id = submit(api, token).json()["trials"][0]["id"]
        first = start_attempt(api, trial_id, 1)
        post = f"/api/v1/trials/{trial_id}/metrics"
        # loss every step, acc every 10th; step 5 reported twice (merged), out of order
        points = [{"step": s, "values": {"loss": 1.0 / (s + 1)}} for s in range(30, 0, -1)]
        points += [{"step": s, "values": {"acc": s / 100}} for s in range(0, 40, 10)]
        points.append({"step": 5, "values": {"loss": 9.0}})
        for batch in (points[:20], points[20:]):
            r = api.client.post(post, json={"points": batch}, headers=first)
            assert r.status_code == 200, r.text
        # a second attempt reports steps 20.. again: only its values stay for those steps
        second = start_attempt(api, trial_id, 2)
        again = [{"step": s, "values": {"loss": 2.0}} for s in range(20, 25)]
        r = api.client.post(post, json={"points": again, "attempt": 2}, headers=second)
        assert r.status_code == 200, r.text

        rows = _rows_view(api, token, trial_id)
        assert rows["acc"] == [(0.0, 0.0), (10.0, 0.1), (30.0, 0.3)]  # 20: replaced by attempt 2
        assert (5.0, 9.0) in rows["loss"]
        chunked = ChartCache(api.services)
        assert _chart_view(chunked, api, token, trial_id, 2) == rows
        # without the chunks (metrics stored before they were kept) the rows are read
        engine = api.services.uow.engine  # type: ignore[attr-defined]
        with engine.begin() as conn:
            conn.execute(delete(MetricChunkRow).where(MetricChunkRow.trial_id == trial_id))
        assert _chart_view(ChartCache(api.services), api, token, trial_id, 2) == rows
        # and new points after a first read arrive through the rows, as before
        more = [{"step": 31, "values": {"loss": 0.5}}]
        r = api.client.post(post, json={"points": more, "attempt": 2}, headers=second)
        assert r.status_code == 200
        assert _chart_view(chunked, api, token, trial_id, 2)["loss"][-1] == (31.0, 0.5)
    finally:
        api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def test_a_chart_lists_the_scripts_metrics_before_the_runtimes() -> None:
    from trainhub.web.charts import _Series

    series = _Series(attempts=1)
    series.extend(
        [0, 1],
        [
            {"val_accuracy": 0.5, "comm/bytes_per_step": 9.0, "time/step_s": 0.1, "loss": 1.0},
            {"layers/fc1/grad_norm": 0.2, "val_accuracy": 0.6, "loss": 0.5},
        ],
    )
    names = list(series.downsampled(100))
    assert names == [
        "loss",
        "val_accuracy",
        "comm/bytes_per_step",
        "layers/fc1/grad_norm",
        "time/step_s",
    ]
