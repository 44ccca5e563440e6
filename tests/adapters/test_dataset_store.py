"""The datasets' tables on SQLite and PostgreSQL: versions by content, visibility, shares,
removal, the bytes a tenant stores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
from trainhub.adapters.db.dataset_store import SqlDatasetStore

A, B, C = "a" * 64, "b" * 64, "c" * 64


@pytest.fixture
def store(db_url: str) -> Iterator[SqlDatasetStore]:
    engine = make_engine(db_url)
    migrate(engine)
    with SqlUnitOfWork(engine)() as repo:
        for name in ("vision", "speech", "nlp"):
            repo.add_tenant(name, 0.0)
    yield SqlDatasetStore(engine)
    engine.dispose()


def test_versions_number_per_dataset_and_unchanged_content_adds_none(
    store: SqlDatasetStore,
) -> None:
    v1, added1 = store.add_version("vision", "flowers", A, 100, "ka", "alice", 1.0)
    same, added_same = store.add_version("vision", "flowers", A, 100, "ka", "alice", 2.0)
    v2, added2 = store.add_version("vision", "flowers", B, 200, "kb", "alice", 3.0)
    back, added_back = store.add_version("vision", "flowers", A, 100, "ka", "alice", 4.0)
    assert (added1, added_same, added2, added_back) == (True, False, True, True)
    assert (v1.version, same.version, v2.version, back.version) == (1, 1, 2, 3)
    assert v2.ref == "vision/flowers:2"
    (flowers,) = store.find_datasets("flowers", "vision")
    assert [(v.version, v.sha256) for v in flowers.versions] == [(1, A), (2, B), (3, A)]
    assert flowers.latest is not None
    assert flowers.latest.version == 3


def test_shares_widen_visibility(store: SqlDatasetStore) -> None:
    store.add_version("vision", "flowers", A, 100, "ka", "alice", 1.0)
    store.add_version("speech", "flowers", B, 100, "kb", "bob", 1.0)
    assert sorted(d.tenant for d in store.find_datasets("flowers")) == ["speech", "vision"]
    assert store.list_datasets(["nlp"], 10) == []
    (vision,) = store.find_datasets("flowers", "vision")
    store.set_share(vision.id, "nlp", True)
    store.set_share(vision.id, "nlp", True)  # twice is once
    (seen,) = store.list_datasets(["nlp"], 10)
    assert (seen.tenant, seen.shared_with) == ("vision", ("nlp",))
    store.set_share(vision.id, "nlp", False)
    assert store.list_datasets(["nlp"], 10) == []
    assert len(store.list_datasets(None, 10)) == 2


def test_content_counts_once_and_goes_with_its_last_version(store: SqlDatasetStore) -> None:
    store.add_version("vision", "one", A, 100, "ka", "alice", 1.0)
    store.add_version("vision", "two", A, 100, "ka", "alice", 1.0)  # the same content
    store.add_version("vision", "two", C, 50, "kc", "alice", 2.0)
    store.add_version("speech", "one", B, 1000, "kb", "bob", 1.0)
    assert store.bytes_of_tenant("vision") == 150
    assert store.bytes_of_tenant("speech") == 1000
    (one,) = store.find_datasets("one", "vision")
    assert store.delete(one.id, None) == []  # "two" still refers to ka
    assert store.find_datasets("one", "vision") == []
    (two,) = store.find_datasets("two", "vision")
    assert store.delete(two.id, 1) == ["ka"]
    assert [v.version for v in store.find_datasets("two", "vision")[0].versions] == [2]
    assert store.bytes_of_tenant("vision") == 50
