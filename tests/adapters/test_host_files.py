"""Host files (issue 24, item 5): Ray's folders and the databases private, uids unique per
node across control planes."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from trainhub.adapters.host_files import HostFiles, create_private, sqlite_files
from trainhub.adapters.optuna_search import prepare_optuna_storage
from trainhub.adapters.ray_executor.trial_uids import (
    MAX_BLOCKS,
    SANDBOX_UID_BASE,
    UID_BLOCK,
    UidBlocksExhausted,
    trial_uid,
    uid_block,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_ray_folders_are_made_private_again_on_every_check(tmp_path: Path) -> None:
    temp = tmp_path / "trainhub-ray-x"
    sockets = temp / "session_2026-11-27_05-00-00_1" / "sockets"
    sockets.mkdir(parents=True)
    (temp / "session_latest").symlink_to(sockets.parent)
    for folder in (temp, sockets.parent, sockets):
        os.chmod(folder, 0o777)  # as Ray leaves them
    files = HostFiles([temp])
    fixed = files.check()
    assert {_mode(temp), _mode(sockets.parent), _mode(sockets)} == {0o700}
    assert len(fixed) == 3
    os.chmod(sockets, 0o777)  # a new session resets one
    assert files.check() == [str(sockets)]
    assert files.check() == []


def test_database_files_are_0600_the_search_one_too(tmp_path: Path) -> None:
    main = tmp_path / "trainhub.db"
    create_private(main)
    assert _mode(main) == 0o600
    storage = prepare_optuna_storage(f"sqlite:///{main}")
    storage.engine.dispose()
    optuna_db = tmp_path / "trainhub-optuna.db"
    assert optuna_db.exists()
    assert _mode(optuna_db) == 0o600  # was 0644
    os.chmod(optuna_db, 0o644)
    files = HostFiles([], [*sqlite_files(main), *sqlite_files(optuna_db)])
    assert files.check() == [str(optuna_db)]
    assert _mode(optuna_db) == 0o600


def test_two_control_planes_never_share_a_uid(tmp_path: Path) -> None:
    registry = tmp_path / "uids" / "uid-blocks.json"
    a = trial_uid("trainhub@/srv/a", 7, registry)
    b = trial_uid("trainhub@/srv/b", 7, registry)
    assert a != b
    assert a == SANDBOX_UID_BASE + 7
    assert b == SANDBOX_UID_BASE + UID_BLOCK + 7
    assert trial_uid("trainhub@/srv/a", 7, registry) == a  # kept across restarts
    assert _mode(registry) == 0o600
    assert _mode(registry.parent) == 0o700
    assert max(trial_uid("trainhub@/srv/b", UID_BLOCK - 1, registry), b) < 2**32 - 1


def _claim(args: tuple[str, str]) -> int:
    return uid_block(args[0], Path(args[1]))


def test_blocks_are_handed_out_once_under_concurrency(tmp_path: Path) -> None:
    registry = tmp_path / "uid-blocks.json"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        blocks = pool.map(_claim, [(f"cp-{i}", str(registry)) for i in range(16)])
    assert sorted(blocks) == list(range(16))


def test_a_full_registry_says_so(tmp_path: Path) -> None:
    registry = tmp_path / "uid-blocks.json"
    registry.write_text(
        "{" + ",".join(f'"cp-{i}": {{"block": {i}, "since": 0}}' for i in range(MAX_BLOCKS)) + "}"
    )
    with pytest.raises(UidBlocksExhausted, match="remove the entries"):
        uid_block("one-more", registry)


@pytest.mark.ray
def test_the_local_head_is_private_and_exports_no_metrics(ray_head: Path) -> None:
    import time

    from trainhub.adapters.host_files import HostFiles
    from trainhub.adapters.ray_executor.local_cluster import RECORD_NAME, read_record

    record = read_record(ray_head)
    assert record is not None
    assert _mode(ray_head / RECORD_NAME) == 0o600
    temp = Path(record.temp_dir)
    # every driver that connects (other tests' executors, on their workers) makes Ray reset its
    # folders to 0777, as the control plane's own connection does: the loop's check after each
    # tick (server.host_files) makes them private again, and is what keeps them so
    HostFiles([temp]).check()
    sessions = [p for p in temp.glob("session_*") if not p.is_symlink()]
    assert sessions
    for folder in (temp, *sessions, *(s / "sockets" for s in sessions)):
        assert _mode(folder) == 0o700, folder
    # Ray's metrics exporter (every interface, no authentication) is off: its agent records
    # the port it serves as -1
    deadline = time.monotonic() + 60
    ports: list[Path] = []
    while time.monotonic() < deadline and not ports:
        ports = list(temp.glob("session_*/metrics_export_port_*"))
        time.sleep(0.5)
    assert ports, "the dashboard agent never recorded its metrics export port"
    assert {p.read_text().strip() for p in ports} == {"-1"}


def test_a_frozen_folder_cannot_be_written_by_its_trial_and_is_then_removed() -> None:
    import subprocess
    import tempfile

    from trainhub.adapters.ray_executor.trial_folders import discard_folder, freeze_folder

    base = Path(tempfile.mkdtemp(prefix="trainhub-freeze-"))  # in /tmp: others may traverse
    os.chmod(base, 0o755)
    folder = base / "trial-checkpoints" / "trial-9"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "fill.bin").write_bytes(b"x" * 100)
    (folder / "link").symlink_to("/etc/passwd")
    trial_uid = SANDBOX_UID_BASE + 9
    root = os.geteuid() == 0

    def as_trial(command: str) -> str:
        argv = ["setpriv", f"--reuid={trial_uid}", f"--regid={trial_uid}", "--clear-groups"]
        return subprocess.run(
            [*argv, "sh", "-c", command], capture_output=True, text=True, check=False
        ).stdout

    if root:
        (base / "trial-checkpoints").chmod(0o755)
        for path in (folder, folder / "sub", folder / "sub" / "fill.bin"):
            os.chown(path, trial_uid, trial_uid)
        # before: the trial writes its own folder
        assert as_trial(f"echo more >> {folder}/sub/fill.bin && echo WROTE") == "WROTE\n"
    freeze_folder(folder)
    assert (_mode(folder), _mode(folder / "sub"), _mode(folder / "sub" / "fill.bin")) == (
        0o555,
        0o555,
        0o444,
    )
    assert stat.S_IMODE(os.stat("/etc/passwd").st_mode) != 0o444  # a link is not followed
    if root:
        assert os.stat(folder / "sub" / "fill.bin").st_uid == 0
        # the trial's uid can neither write nor make it writable again
        tried = as_trial(
            f"chmod 0777 {folder} 2>/dev/null || echo REFUSED; "
            f"(echo more >> {folder}/sub/fill.bin) 2>/dev/null || echo REFUSED"
        )
        assert tried == "REFUSED\nREFUSED\n"
    discard_folder(folder)
    assert not folder.exists()
    discard_folder(base)
    assert os.path.exists("/etc/passwd")
