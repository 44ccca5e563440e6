"""The control plane's files on its host: private to its user, checked again on every tick.

Ray creates its temporary, session and socket folders with mode 0777 (its own umask handling)
and resets them when a session starts, whatever mode the folder had (issue 24; ADR 0007 wants
0700). SQLite creates a database's ``-wal`` and ``-shm`` files beside it; Optuna's database
is a second file. Every one of them must be readable by the server's user only: a tenant's
code on the node (as another uid, in its sandbox or not) must not read the cluster token's
neighbours, the sockets of the raylet, or another tenant's rows.

:meth:`HostFiles.check` is cheap (a few ``lstat`` calls) and runs after every control-loop
tick; what it had to fix is logged once per path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def ray_folders(temp_dir: Path) -> list[Path]:
    """A Ray head's temp dir, its session folders and the folders in them (sockets, logs,
    runtime resources); links are not followed."""
    found = [temp_dir]
    for session in sorted(temp_dir.glob("session_*")):
        if session.is_symlink():
            continue
        found.append(session)
        with contextlib.suppress(OSError):
            found.extend(p for p in session.iterdir() if not p.is_symlink())
    return found


def sqlite_files(database: Path) -> list[Path]:
    """A SQLite database file and the files SQLite keeps beside it."""
    return [Path(f"{database}{suffix}") for suffix in SQLITE_SUFFIXES]


class HostFiles:
    """Folders that must be 0700 and files that must be 0600, made so and kept so."""

    def __init__(self, ray_temp_dirs: Iterable[Path] = (), files: Iterable[Path] = ()) -> None:
        self.ray_temp_dirs = [Path(p) for p in ray_temp_dirs]
        self.files = [Path(p) for p in files]
        self._reported: set[str] = set()

    def check(self) -> list[str]:
        """Make every folder 0700 and every file 0600 that is not; returns what was fixed."""
        fixed: list[str] = []
        for temp_dir in self.ray_temp_dirs:
            for folder in ray_folders(temp_dir):
                fixed += _restrict(folder, 0o700, want_dir=True)
        for path in self.files:
            fixed += _restrict(path, 0o600, want_dir=False)
        for name in fixed:
            if name not in self._reported:
                self._reported.add(name)
                log.info("made %s private to the server's user", name)
        return fixed


def _restrict(path: Path, mode: int, want_dir: bool) -> list[str]:
    try:
        info = os.lstat(path)
    except OSError:
        return []
    is_dir = stat.S_ISDIR(info.st_mode)
    if is_dir != want_dir or (not is_dir and not stat.S_ISREG(info.st_mode)):
        return []
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077 == 0:
        return []  # not ours to change, or private already
    try:
        os.chmod(path, mode)
    except OSError:
        return []
    return [str(path)]


def create_private(path: Path) -> None:
    """Create ``path`` (an empty file) with mode 0600 if it does not exist, and make an
    existing one 0600: SQLite then gives its ``-wal`` and ``-shm`` files the same mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for each in sqlite_files(path):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(each, 0o600)
