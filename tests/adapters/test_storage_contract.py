"""The ArtifactStore contract, run against every backend (a folder, an S3 bucket on SeaweedFS).

Optuna-style: one suite, a parametrized ``store`` fixture; a new backend joins by adding a
parameter. What the contract promises is written in ``trainhub.service.ports.ArtifactStore``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.seaweedfs import SeaweedS3
from trainhub.adapters.storage import LocalArtifactStore
from trainhub.core.errors import CorruptArtifact, InvalidRequest, NotFound
from trainhub.service import artifact_sets
from trainhub.service.ports import ArtifactStore, BlobInfo

BACKENDS = ["file", "s3"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    if request.param == "file":
        yield LocalArtifactStore(tmp_path / "artifacts")
        return
    s3: SeaweedS3 = request.getfixturevalue("seaweed")
    # small parts so that a few MB exercise the multipart path
    yield s3.store(part_bytes=5 << 20, concurrency=3)


def blob(size: int, seed: int = 0) -> bytes:
    return (bytes(range(251)) * (size // 251 + 1))[seed : seed + size]


def test_put_get_exists_size(store: ArtifactStore) -> None:
    assert not store.exists("a/b.txt")
    assert store.size("a/b.txt") == 0
    store.put("a/b.txt", b"hello")
    assert store.exists("a/b.txt")
    assert store.get("a/b.txt") == b"hello"
    assert store.size("a/b.txt") == 5
    store.put("a/b.txt", b"bye")  # overwrite
    assert store.get("a/b.txt") == b"bye"


def test_missing_blob_raises_not_found_before_any_chunk(store: ArtifactStore) -> None:
    with pytest.raises(NotFound):
        store.get("nothing/here")
    with pytest.raises(NotFound):
        store.iter_chunks("nothing/here")


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "", "a/../../b"])
def test_keys_that_leave_the_store_are_refused(store: ArtifactStore, key: str) -> None:
    with pytest.raises(InvalidRequest):
        store.put(key, b"x")


def test_streamed_blob_round_trips_in_chunks(store: ArtifactStore) -> None:
    data = blob(12 << 20, seed=3)  # more than two parts on S3
    size = store.put_file("ckpt/big.pt", io.BytesIO(data))
    assert size == len(data) == store.size("ckpt/big.pt")
    chunks = list(store.iter_chunks("ckpt/big.pt", 1 << 20))
    assert all(len(c) <= 1 << 20 for c in chunks)
    assert b"".join(chunks) == data


def test_writer_is_invisible_until_commit(store: ArtifactStore) -> None:
    writer = store.open_writer("ckpt/w.pt")
    data = blob(11 << 20)
    for at in range(0, len(data), 1 << 20):
        writer.write(data[at : at + (1 << 20)])
        assert not store.exists("ckpt/w.pt")
    assert store.list("ckpt/") == []
    assert writer.commit() == len(data)
    assert store.get("ckpt/w.pt") == data
    writer.abort()  # a no-op after commit
    assert store.exists("ckpt/w.pt")


def test_aborted_writer_leaves_nothing(store: ArtifactStore) -> None:
    writer = store.open_writer("ckpt/gone.pt")
    writer.write(blob(7 << 20))
    writer.abort()
    writer.abort()  # idempotent
    assert not store.exists("ckpt/gone.pt")
    assert store.list("ckpt/") == []


def test_empty_blob(store: ArtifactStore) -> None:
    writer = store.open_writer("e/empty")
    assert writer.commit() == 0
    assert store.exists("e/empty")
    assert store.get("e/empty") == b""
    assert b"".join(store.iter_chunks("e/empty")) == b""


def test_list_counts_the_bytes_written(store: ArtifactStore) -> None:
    store.put("t/1/a", b"x" * 10)
    store.put("t/1/sub/b", b"y" * 20)
    store.put("t/2/c", b"z")
    assert store.list("t/1/") == [BlobInfo("t/1/a", 10), BlobInfo("t/1/sub/b", 20)]
    assert [b.key for b in store.list("t/")] == ["t/1/a", "t/1/sub/b", "t/2/c"]
    assert sum(b.size for b in store.list("")) == 31
    assert store.list("nope/") == []


def test_delete(store: ArtifactStore) -> None:
    store.put("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")  # absent: no error
    assert not store.exists("d/x")


def test_write_at_appends_and_read_range(store: ArtifactStore) -> None:
    store.write_at("logs/r0", 0, b"hello ")
    store.write_at("logs/r0", 6, b"world\n")
    assert store.read_range("logs/r0", 0) == b"hello world\n"
    store.write_at("logs/r0", 6, b"there\n")  # a repeated append replaces what followed
    assert store.read_range("logs/r0", 6) == b"there\n"
    assert store.read_range("logs/r0", 2, 3) == b"llo"
    assert store.read_range("logs/r0", 100) == b""
    assert store.read_range("logs/none", 0) == b""
    assert store.size("logs/r0") == 12


def test_many_appends_read_back_whole_and_in_order(store: ArtifactStore) -> None:
    # a log: a line per append (more appends than a bucket keeps small segments of)
    lines = [f"step {i} loss {1 / (i + 1):.4f}\n".encode() for i in range(150)]
    at = 0
    for line in lines:
        store.write_at("logs/r1", at, line)
        at += len(line)
    whole = b"".join(lines)
    assert store.size("logs/r1") == len(whole)
    assert store.exists("logs/r1")
    assert store.get("logs/r1") == whole
    assert store.read_range("logs/r1", 0) == whole
    assert store.read_range("logs/r1", 1000, 333) == whole[1000:1333]
    assert store.read_range("logs/r1", len(whole) - 40) == whole[-40:]
    assert b"".join(store.iter_chunks("logs/r1", 100)) == whole
    assert store.list("logs/") == [BlobInfo("logs/r1", len(whole))]
    # written again from the middle (a restarted control plane repeating an append)
    store.write_at("logs/r1", 500, b"again\n")
    assert store.get("logs/r1") == whole[:500] + b"again\n"
    store.delete("logs/r1")
    assert not store.exists("logs/r1")
    assert store.list("logs/") == []


def test_a_whole_put_and_appends_replace_each_other(store: ArtifactStore) -> None:
    store.write_at("logs/r2", 0, b"first ")
    store.write_at("logs/r2", 6, b"second\n")
    store.put("logs/r2", b"rewritten\n")  # the log cap's rewrite
    assert store.get("logs/r2") == b"rewritten\n"
    assert store.size("logs/r2") == 10
    store.write_at("logs/r2", 10, b"then more\n")
    assert store.get("logs/r2") == b"rewritten\nthen more\n"
    assert store.list("logs/") == [BlobInfo("logs/r2", 20)]
    store.write_at("logs/r2", 0, b"")  # truncated to nothing: an empty blob
    assert store.exists("logs/r2")
    assert store.get("logs/r2") == b""
    store.write_at("logs/r2", 0, b"anew")
    assert store.get("logs/r2") == b"anew"


def test_a_set_is_visible_only_after_its_manifest(store: ArtifactStore) -> None:
    prefix = "t/7/ckpt/abc"
    shards = {f"rank-{r}.pt": blob((3 << 20) + r, seed=r) for r in range(3)}
    members = []
    for name, data in shards.items():
        members.append(artifact_sets.write_member(store, prefix, name, [data]))
        assert artifact_sets.read_set(store, prefix) is None
        assert artifact_sets.list_sets(store, "t/7/") == []
    published = artifact_sets.publish_set(store, prefix, members, {"step": 5})
    found = artifact_sets.read_set(store, prefix)
    assert found == published
    assert found.meta == {"step": 5}
    assert found.size == sum(len(d) for d in shards.values())
    assert artifact_sets.list_sets(store, "t/7/") == [prefix]
    assert artifact_sets.verify_set(store, found) == []
    for name, data in shards.items():
        assert b"".join(artifact_sets.iter_member(store, found, name)) == data
    artifact_sets.delete_set(store, prefix)
    assert artifact_sets.read_set(store, prefix) is None
    assert store.list(prefix + "/") == []


def test_a_set_with_a_missing_member_is_not_published(store: ArtifactStore) -> None:
    member = artifact_sets.write_member(store, "s/1", "a", [b"abc"])
    ghost = artifact_sets.SetMember("b", 3, "0" * 64)
    with pytest.raises(NotFound, match="'b'"):
        artifact_sets.publish_set(store, "s/1", [member, ghost])
    assert artifact_sets.read_set(store, "s/1") is None


def test_a_damaged_member_is_refused_by_name(store: ArtifactStore) -> None:
    member = artifact_sets.write_member(store, "s/2", "w.pt", [b"good bytes"])
    found = artifact_sets.publish_set(store, "s/2", [member])
    store.put("s/2/w.pt", b"evil bytes")
    assert artifact_sets.verify_set(store, found) == ["w.pt"]
    with pytest.raises(CorruptArtifact, match=r"s/2/w\.pt"):
        b"".join(artifact_sets.iter_member(store, found, "w.pt"))


def test_many_writers_at_once(store: ArtifactStore) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def save(i: int) -> int:
        return store.put_file(f"par/{i}", io.BytesIO(blob(1 << 20, seed=i)))

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(save, range(8)))
    assert sizes == [1 << 20] * 8
    assert all(store.get(f"par/{i}") == blob(1 << 20, seed=i) for i in range(8))


def test_unfinished_writes_are_listed_and_aborted(store: ArtifactStore) -> None:
    """A writer never committed (its process killed) leaves an unfinished write that ``list``
    never shows and ``list_unfinished`` does; aborting it frees it (ADR 0047)."""
    import contextlib
    import time

    store.put("ckpt/done.pt", b"whole")
    writer = store.open_writer("ckpt/sub/killed.pt")
    writer.write(blob(6 << 20))  # more than a part on S3: a multipart upload is open
    wait_sent = getattr(writer, "wait_sent", None)
    if wait_sent is not None:
        wait_sent()
    assert [b.key for b in store.list("ckpt/")] == ["ckpt/done.pt"]
    (found,) = store.list_unfinished("ckpt/")
    assert found.key.startswith("ckpt/sub/")
    assert abs(found.started_at - time.time()) < 300
    assert store.list_unfinished("other/") == []
    store.abort_unfinished(found)
    store.abort_unfinished(found)  # idempotent
    assert store.list_unfinished("ckpt/") == []
    assert [b.key for b in store.list("ckpt/")] == ["ckpt/done.pt"]
    with contextlib.suppress(Exception):  # its upload is gone already
        writer.abort()


def test_committed_and_aborted_writers_leave_no_unfinished_write(store: ArtifactStore) -> None:
    kept = store.open_writer("ckpt/a.pt")
    kept.write(blob(6 << 20))
    kept.commit()
    dropped = store.open_writer("ckpt/b.pt")
    dropped.write(blob(6 << 20))
    dropped.abort()
    assert store.list_unfinished("ckpt/") == []
    assert [b.key for b in store.list("ckpt/")] == ["ckpt/a.pt"]
