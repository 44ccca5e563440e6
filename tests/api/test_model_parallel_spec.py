"""Issue 28: the pipeline/tensor lines of a spec, refused at submit with the field's path when
the world cannot be laid out (real app on SQLite; the cluster of tests/api/conftest.py: nodes
of 8 and 4 CPUs)."""

from __future__ import annotations

import pytest

from tests.api.test_auth import submit
from tests.api.test_bounds import BASE, count_experiments, refused
from tests.fixtures.api import Api


@pytest.mark.parametrize(
    ("lines", "path", "words"),
    [
        (  # 6 ranks do not factor into 4 x tensor 2... with stages 4: 8 per replica
            "resources: {workers: 6}\ndistributed: {pipeline: {stages: 4}, tensor: 2}\n",
            "distributed.pipeline.stages",
            ("multiple of 8",),
        ),
        (
            "resources: {workers: 3}\ndistributed: {tensor: 2}\n",
            "distributed.tensor",
            ("multiple of 2",),
        ),
        (
            "resources: {workers: 2}\ndistributed: {pipeline: {stages: 2, schedule: zb}}\n",
            "distributed.pipeline.schedule",
            ("gpipe", "1f1b"),
        ),
        (
            "resources: {workers: 2}\n"
            "distributed: {pipeline: {stages: 2, microbatches: 1, schedule: 1f1b}}\n",
            "distributed.pipeline",
            ("microbatches",),
        ),
        (
            "resources: {workers: 2}\n"
            "distributed: {pipeline: {stages: 2, split_points: [blocks.1, blocks.2]}}\n",
            "distributed.pipeline",
            ("split_points",),
        ),
        (  # a tensor group of 4 must share a node; the largest holds 3 of 2.5 CPUs
            "resources: {workers: 4, cpus_per_worker: 2.5}\ndistributed: {tensor: 4}\n",
            "distributed.tensor",
            ("share one node", "at most 3"),
        ),
        (  # 4 ranks fit (3 + 1) but not as two groups of 2, one per node
            "resources: {workers: 4, cpus_per_worker: 2.5}\ndistributed: {tensor: 2}\n",
            "distributed.tensor",
            ("groups of 2",),
        ),
        (
            "resources: {workers: 4}\ndistributed: {tensor: 2, memory: {fsdp: true}}\n",
            "distributed",
            ("fsdp",),
        ),
    ],
)
def test_a_layout_the_world_cannot_hold_is_refused_at_submit(
    sapi: Api, lines: str, path: str, words: tuple[str, ...]
) -> None:
    member = sapi.user("alice", "vision")
    body = refused(submit(sapi, member, spec=BASE + lines), 422, "invalid_spec", *words)
    assert any(e["path"].startswith(path) for e in body["errors"]), body
    assert count_experiments(sapi) == 0


def test_a_layout_that_factors_is_accepted(bapi: Api) -> None:
    member = bapi.user("alice", "vision")
    spec = BASE + (
        "resources: {workers: 8, cpus_per_worker: 0.5}\n"
        "distributed: {pipeline: {stages: 2, microbatches: 4, schedule: gpipe}, tensor: 2}\n"
    )
    assert submit(bapi, member, spec=spec).status_code == 201
