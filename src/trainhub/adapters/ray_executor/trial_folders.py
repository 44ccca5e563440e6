"""A trial's checkpoint folder at the end of its life: frozen when it passed its storage
quota (it keeps what it wrote, and cannot write more while it stops), removed when the trial
ended (retention: its registered checkpoints are in the artifact store)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def freeze_folder(root: Path) -> None:
    """Folders 0555, files 0444; as root also owned by root again: a sandboxed rank runs as
    the folder's owner and could otherwise make it writable again. Links are not followed."""
    owner = os.geteuid() if os.geteuid() == 0 else None
    for folder, _dirs, files in os.walk(root):
        entries = [*((os.path.join(folder, f), 0o444) for f in files), (folder, 0o555)]
        for path, mode in entries:
            with contextlib.suppress(OSError):
                if owner is not None:
                    os.chown(path, owner, owner, follow_symlinks=False)
                if not os.path.islink(path):
                    os.chmod(path, mode)


EVENT_FILE_MARK = ".tfevents."  # TensorBoard's names: events.out.tfevents.<time>.<host>...


def event_files(root: Path, max_bytes: int) -> dict[str, bytes]:
    """TensorBoard event files under ``root`` (``{path relative to root: bytes}``), newest
    first until ``max_bytes``; links are not followed (a trial's folder is the trial's)."""
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if EVENT_FILE_MARK not in name or path.is_symlink():
                continue
            with contextlib.suppress(OSError):
                stat = path.stat()
                found.append((stat.st_mtime, stat.st_size, path))
    out: dict[str, bytes] = {}
    total = 0
    for _, size, path in sorted(found, reverse=True):
        if total + size > max_bytes:
            continue
        with contextlib.suppress(OSError):
            out[str(path.relative_to(root))] = path.read_bytes()
            total += size
    return out


def discard_folder(root: Path) -> None:
    """Remove the folder, frozen or not."""
    if not root.exists():
        return
    for folder, _dirs, _files in os.walk(root):
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)
    shutil.rmtree(root, ignore_errors=True)
