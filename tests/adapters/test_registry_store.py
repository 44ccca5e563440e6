"""The model registry's tables on SQLite and PostgreSQL: versions, visibility, shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainhub.adapters.db import SqlUnitOfWork, make_engine, migrate
from trainhub.adapters.db.registry_store import SqlModelStore
from trainhub.service.registry import NewVersion

NEW = NewVersion({"zoo": "mlp"}, {"val_accuracy": 0.9}, {"lr": 0.1}, {"trial_id": 1})


@pytest.fixture
def store(db_url: str) -> Iterator[SqlModelStore]:
    engine = make_engine(db_url)
    migrate(engine)
    with SqlUnitOfWork(engine)() as repo:
        for name in ("vision", "speech", "nlp"):
            repo.add_tenant(name, 0.0)
    yield SqlModelStore(engine)
    engine.dispose()


def test_versions_number_per_model_and_shares_widen_visibility(store: SqlModelStore) -> None:
    v1 = store.add_version("vision", "base", "first", "k1", 10, NEW, "alice", 1.0)
    v2 = store.add_version("vision", "base", "", "k2", 20, NEW, "alice", 2.0)
    other = store.add_version("speech", "base", "theirs", "k3", 30, NEW, "bob", 3.0)
    assert (v1.version, v2.version, other.version) == (1, 2, 1)
    assert v2.ref == "vision/base:2"
    both = store.find_models("base")
    assert sorted(m.tenant for m in both) == ["speech", "vision"]
    (vision,) = store.find_models("base", "vision")
    assert vision.description == "first"  # an empty description keeps the old one
    assert [v.version for v in vision.versions] == [1, 2]
    assert vision.versions[1].metrics == {"val_accuracy": 0.9}
    assert [m.tenant for m in store.list_models(["nlp"], 10)] == []
    store.set_share(vision.id, "nlp", True)
    store.set_share(vision.id, "nlp", True)  # idempotent
    assert [m.tenant for m in store.list_models(["nlp"], 10)] == ["vision"]
    assert store.find_models("base", "vision")[0].shared_with == ("nlp",)
    store.set_share(vision.id, "nlp", False)
    assert store.list_models(["nlp"], 10) == []
    assert len(store.list_models(None, 10)) == 2
    assert len(store.list_models(None, 1)) == 1
    assert store.bytes_of_tenant("vision") == 30
    assert store.bytes_of_tenant("nlp") == 0
