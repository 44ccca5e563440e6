"""Trial environments with uv: ``uv pip compile`` to a lock, a venv layered over the base.

The venv of an environment holds only what the base does not: ``uv venv`` on the base's
interpreter, a ``.pth`` file that adds the base's site-packages after its own (so torch, the
trainhub runtime and their dependencies come from the base, once for every environment), and
``uv pip install --no-deps`` of the lock's pins the base lacks. Every package of the base is a
constraint of the resolution: a request cannot pull another numpy under the base's torch.

Each environment is installed once per cache folder under an exclusive file lock (a second
builder, thread or process, waits and then finds it installed), is marked complete by a file
written last, and is made read-only. The cache folder is per node, or on storage all nodes
share (docs/environments.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import platform
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from trainhub.core.environments import BaseIdentity, canonical_name
from trainhub.service.environments import BaseEnvironment, BuildFailed, Installed

READY_MARKER = ".trainhub-ready"  # written last: a folder without it is an interrupted build
BASE_PTH = "_trainhub_base.pth"
RESOLVE_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 1800.0


def uv_binary() -> str:
    """The ``uv`` of the ``uv`` wheel (a project dependency), else one on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except Exception:  # not importable: an installation without the wheel
        found = shutil.which("uv")
        if found is None:
            raise BuildFailed("uv is not installed on this node (pip install uv)", "") from None
        return found


class UvEnvironments:
    """:class:`~trainhub.service.environments.EnvironmentBuilder` on uv.

    Args:
        root: the cache folder, one subfolder per environment key.
        python: the base interpreter (default: this process's, which the ranks also run).
        index_args: where packages come from, as uv options (e.g. ``["--index-url", URL]``
            or ``["--no-index", "--find-links", DIR]``); default uv's (``UV_INDEX_URL`` and
            uv's other variables apply).
    """

    def __init__(
        self, root: Path, python: str | None = None, index_args: Sequence[str] = ()
    ) -> None:
        self.root = Path(root)
        self.python = python or sys.executable
        self.index_args = list(index_args)

    # ---------------------------------------------------------------- the base

    def base(self) -> BaseEnvironment:
        versions: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                versions.setdefault(canonical_name(name), dist.version)
        identity = BaseIdentity.of(platform.python_version(), versions.items())
        return BaseEnvironment(identity, versions)

    # ---------------------------------------------------------------- resolving

    def resolve(self, lines: Sequence[str], base: BaseEnvironment) -> tuple[str, str]:
        with tempfile.TemporaryDirectory(prefix="trainhub-resolve-") as scratch:
            folder = Path(scratch)
            (folder / "requirements.in").write_text("\n".join(lines) + "\n")
            # the base's versions bind the resolution (local labels such as +cpu are not on
            # an index: the public version is the same release)
            pins = sorted(f"{n}=={v.split('+', 1)[0]}" for n, v in base.versions.items())
            (folder / "base.txt").write_text("\n".join(pins) + "\n")
            argv = [
                uv_binary(),
                "pip",
                "compile",
                str(folder / "requirements.in"),
                "--constraint",
                str(folder / "base.txt"),
                "--python",
                self.python,
                "--no-header",
                "--no-annotate",
                "--quiet",
                "--output-file",
                str(folder / "lock.txt"),
                *self._index_args(),
            ]
            output = _run(argv, RESOLVE_TIMEOUT_S, "resolving")
            return (folder / "lock.txt").read_text(), output

    # ---------------------------------------------------------------- installing

    def install(self, key: str, packages: Sequence[str], base: BaseEnvironment) -> Installed:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.root / key
        with _exclusive(self.root / f"{key}.lock"):
            if (target / READY_MARKER).exists():
                return Installed(str(target), _size(target), False, "already installed")
            if target.exists():  # an interrupted build: start again
                _remove_tree(target)
            started = time.monotonic()
            logs = [
                _run(
                    [uv_binary(), "venv", "--python", self.python, "--quiet", str(target)],
                    INSTALL_TIMEOUT_S,
                    "creating the venv",
                )
            ]
            self._layer_over_base(target)
            if packages:
                requirements = target / "trainhub-packages.txt"
                requirements.write_text("\n".join(packages) + "\n")
                logs.append(
                    _run(
                        [
                            uv_binary(),
                            "pip",
                            "install",
                            "--python",
                            str(target / "bin" / "python"),
                            "--no-deps",
                            "--link-mode",
                            "copy",  # independent of uv's cache, which may be pruned
                            "-r",
                            str(requirements),
                            *self._index_args(),
                        ],
                        INSTALL_TIMEOUT_S,
                        "installing",
                    )
                )
            (target / READY_MARKER).write_text(f"{time.monotonic() - started:.3f}\n")
            _make_read_only(target)
            return Installed(str(target), _size(target), True, "\n".join(x for x in logs if x))

    def _layer_over_base(self, target: Path) -> None:
        """The venv sees the base's packages after its own (a .pth runs site.addsitedir, so
        the base's own .pth files, editable installs included, apply too)."""
        found = sorted(target.glob("lib/python*/site-packages"))
        if not found:
            raise BuildFailed(f"the venv {target} has no site-packages", "")
        base_dirs = [p for p in site.getsitepackages() if os.path.isdir(p)]
        lines = [f"import site; site.addsitedir({d!r})" for d in base_dirs]
        (found[0] / BASE_PTH).write_text("\n".join(lines) + "\n")

    def _index_args(self) -> list[str]:
        return list(self.index_args)

    # ---------------------------------------------------------------- the cache

    def path(self, key: str) -> str | None:
        target = self.root / key
        return str(target) if (target / READY_MARKER).exists() else None

    def remove(self, key: str) -> None:
        target = self.root / key
        with _exclusive(self.root / f"{key}.lock"):
            if target.exists():
                _remove_tree(target)
        with contextlib.suppress(FileNotFoundError):
            (self.root / f"{key}.lock").unlink()


def _run(argv: list[str], timeout_s: float, what: str) -> str:
    """Run a uv command; its output, or BuildFailed with uv's own message."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA"))}
    env.setdefault("UV_NO_PROGRESS", "1")
    shown = " ".join(a if " " not in a else repr(a) for a in argv[1:])
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        message = f"{what} took longer than {timeout_s:.0f} s (uv {shown})"
        raise BuildFailed(message, message) from None
    output = f"$ uv {shown}\n{result.stdout}{result.stderr}".strip()
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip() or f"uv exited with {result.returncode}"
        raise BuildFailed(f"{what} failed: {said}", output)
    return output


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second builder waits here for the first
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _make_read_only(root: Path) -> None:
    """Nobody writes an environment once built (the sandbox mounts it read-only as well)."""
    for folder, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o555)
    os.chmod(root, 0o555)


def _remove_tree(root: Path) -> None:
    for folder, dirs, _files in os.walk(root):
        os.chmod(folder, 0o755)
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)
    shutil.rmtree(root, ignore_errors=True)


def _size(root: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total
