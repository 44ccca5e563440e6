"""A node's dataset cache on a real file system: one fetch however many ranks ask at once,
least-recently-used eviction that spares versions in use, nothing kept of a failed fetch."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import tarfile
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from trainhub.adapters.dataset_cache import DatasetCache, DatasetFetchError


def archive(files: dict[str, bytes]) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return raw, hashlib.sha256(raw).hexdigest()


def _acquire_in_another_process(root: str, raw: bytes, sha: str, hold_s: float) -> int:
    cache = DatasetCache(root)

    def fetch(out: BinaryIO) -> None:
        time.sleep(0.3)  # a slow download: the other process must wait, not fetch again
        out.write(raw)

    held = cache.acquire(sha, len(raw), fetch)
    time.sleep(hold_s)
    cache.release(held)
    return held.copied_bytes


def test_ranks_that_ask_at_once_fetch_once(tmp_path: Path) -> None:
    raw, sha = archive({"a.txt": b"alpha", "dir/b.txt": b"beta"})
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        copied = pool.starmap(_acquire_in_another_process, [(str(tmp_path), raw, sha, 0.1)] * 3)
    assert sorted(copied) == [0, 0, len(raw)]
    record = DatasetCache(tmp_path).record(sha)
    assert record is not None
    assert (record.fetches, record.hits) == (1, 2)
    assert (tmp_path / "entries" / sha / "dir" / "b.txt").read_bytes() == b"beta"
    assert list((tmp_path / "incoming").iterdir()) == []


def _hold_until_both_hold(root: str, raw: bytes, sha: str, me: int) -> bool:
    """Acquire, then wait (as ranks in a rendezvous do) until the other process holds it too."""
    cache = DatasetCache(root)
    held = cache.acquire(sha, len(raw), lambda out: out.write(raw))
    Path(root, f"holding-{me}").touch()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if Path(root, f"holding-{1 - me}").exists():
            cache.release(held)
            return True
        time.sleep(0.05)
    cache.release(held)
    return False


def test_two_ranks_of_one_trial_on_a_node_hold_a_version_at_once(tmp_path: Path) -> None:
    # a rank keeps the version held while it runs; the other rank of its trial must not wait
    # for that (they would wait for each other: one in the rendezvous, one for the lock)
    raw, sha = archive({"a.txt": b"alpha"})
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        both = pool.starmap(_hold_until_both_hold, [(str(tmp_path), raw, sha, i) for i in (0, 1)])
    assert both == [True, True]
    record = DatasetCache(tmp_path).record(sha)
    assert record is not None
    assert (record.fetches, record.hits) == (1, 1)


def test_least_recently_used_go_first_but_not_one_in_use(tmp_path: Path) -> None:
    # 8,000 bytes on disk each, 10,240 as an archive: room for two and the next one's archive
    versions = [archive({"x.bin": bytes([i]) * 8000}) for i in range(4)]
    cache = DatasetCache(tmp_path, max_bytes=25_000)
    held = []
    for raw, sha in versions[:2]:
        held.append(cache.acquire(sha, len(raw), lambda out, raw=raw: out.write(raw)))
    cache.release(held[1])  # version 1 is free; version 0 (older) is still in use
    raw, sha = versions[2]
    cache.release(cache.acquire(sha, len(raw), lambda out: out.write(raw)))
    present = {p.name for p in (tmp_path / "entries").iterdir()}
    assert present == {versions[0][1], versions[2][1]}  # 1 evicted, 0 spared: in use
    cache.release(held[0])
    raw, sha = versions[3]
    cache.release(cache.acquire(sha, len(raw), lambda out: out.write(raw)))
    present = {p.name for p in (tmp_path / "entries").iterdir()}
    assert present == {versions[2][1], versions[3][1]}
    assert cache.record(versions[0][1]) is None


def test_a_failed_fetch_leaves_nothing_a_later_rank_would_trust(tmp_path: Path) -> None:
    raw, sha = archive({"a.txt": b"alpha"})
    cache = DatasetCache(tmp_path)

    def broken(out: BinaryIO) -> None:
        out.write(raw[:100])
        raise DatasetFetchError("connection lost")

    with pytest.raises(DatasetFetchError):
        cache.acquire(sha, len(raw), broken)
    assert not cache.entry(sha).exists()
    assert cache.record(sha) is None
    assert list((tmp_path / "incoming").iterdir()) == []
    held = cache.acquire(sha, len(raw), lambda out: out.write(raw))
    assert held.copied_bytes == len(raw)
    assert (held.path / "a.txt").read_bytes() == b"alpha"


def test_an_archive_that_escapes_its_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../../outside.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    raw = buffer.getvalue()
    sha = hashlib.sha256(raw).hexdigest()
    with pytest.raises(DatasetFetchError, match="does not extract"):
        DatasetCache(tmp_path / "cache").acquire(sha, len(raw), lambda out: out.write(raw))
    assert not (tmp_path / "outside.txt").exists()


def test_room_is_made_before_a_fetch(tmp_path: Path) -> None:
    old_raw, old_sha = archive({"x.bin": b"o" * 6000})
    new_raw, new_sha = archive({"y.bin": b"n" * 6000})
    cache = DatasetCache(tmp_path, max_bytes=10_000)
    cache.release(cache.acquire(old_sha, len(old_raw), lambda out: out.write(old_raw)))
    seen: list[set[str]] = []

    def fetch(out: BinaryIO) -> None:
        seen.append({p.name for p in (tmp_path / "entries").iterdir()})
        out.write(new_raw)

    cache.release(cache.acquire(new_sha, len(new_raw), fetch))
    assert seen == [set()]  # the old version was gone before the new one arrived
    assert {p.name for p in (tmp_path / "entries").iterdir()} == {new_sha}
