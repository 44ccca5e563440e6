"""The code context of a submission: a directory packed as tar.gz, minus what is ignored.

What is left out, like git would: patterns of ``.gitignore`` and ``.trainhubignore`` files (in
the directory and its subdirectories, gitignore syntax; a deeper file overrides, and
.trainhubignore overrides .gitignore in the same directory), and always ``.git``,
``__pycache__``, ``.venv`` and ``*.pyc``. Symbolic links to files are packed as the files they
point to; links to directories are skipped (the server refuses links that leave the context).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from trainhub.service.context_archive import DEFAULT_MAX_CONTEXT_BYTES

IGNORE_FILES = (".gitignore", ".trainhubignore")
ALWAYS_EXCLUDED = pathspec.GitIgnoreSpec.from_lines([".git/", "__pycache__/", ".venv/", "*.pyc"])
MAX_CONTEXT_BYTES = DEFAULT_MAX_CONTEXT_BYTES  # the server's default limit (compressed)
UNPACKED_FACTOR = 4  # the server also refuses contexts that unpack to more than 4x the limit


class ContextError(Exception):
    """The context directory cannot be packed; the message says why and what to do."""


@dataclass(frozen=True)
class ContextFile:
    path: str  # relative, with '/' separators: the name in the archive
    source: Path
    size_bytes: int


@dataclass
class PackedContext:
    data: bytes
    files: list[ContextFile]
    skipped: list[str] = field(default_factory=list)  # links to directories, sockets, ...

    @property
    def names(self) -> set[str]:
        return {f.path for f in self.files}

    @property
    def unpacked_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True)
class _Rules:
    base: str  # the directory the ignore file sits in, '' or 'a/b/'
    spec: pathspec.GitIgnoreSpec


def _read_rules(directory: Path, base: str) -> list[_Rules]:
    rules = []
    for name in IGNORE_FILES:
        try:
            lines = (directory / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        rules.append(_Rules(base, pathspec.GitIgnoreSpec.from_lines(lines)))
    return rules


def _ignored(path: str, rules: list[_Rules]) -> bool:
    """Whether ``path`` (a directory ends in '/') is ignored; the last matching rule decides."""
    if ALWAYS_EXCLUDED.match_file(path):
        return True
    verdict = False
    for rule in rules:
        if path.startswith(rule.base):
            include = rule.spec.check_file(path[len(rule.base) :]).include
            if include is not None:
                verdict = include
    return verdict


def collect_files(root: Path) -> tuple[list[ContextFile], list[str]]:
    """The files of ``root`` that go into the context, and the paths skipped (with why)."""
    root = root.resolve()
    files: list[ContextFile] = []
    skipped: list[str] = []
    rules_of: dict[str, list[_Rules]] = {"": _read_rules(root, "")}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        base = "" if rel_dir == "." else rel_dir + "/"
        rules = rules_of[base]
        kept = []
        for name in sorted(dirnames):
            path = base + name
            if _ignored(path + "/", rules):
                continue
            if (Path(dirpath) / name).is_symlink():
                skipped.append(f"{path}/ (a link to a directory)")
                continue
            rules_of[path + "/"] = rules + _read_rules(Path(dirpath) / name, path + "/")
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = base + name
            if _ignored(path, rules):
                continue
            source = Path(dirpath) / name
            try:
                info = source.stat()  # follows links: a link to a file is packed as the file
            except OSError:
                skipped.append(f"{path} (a broken link)")
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append(f"{path} (not a regular file)")
                continue
            files.append(ContextFile(path, source, info.st_size))
    return files, skipped


def _too_large(root: Path, what: str, files: list[ContextFile]) -> ContextError:
    biggest = sorted(files, key=lambda f: f.size_bytes, reverse=True)[:5]
    listing = "\n".join(f"    {human_bytes(f.size_bytes):>10}  {f.path}" for f in biggest)
    example = biggest[0].path.split("/")[0] + ("/" if "/" in biggest[0].path else "")
    return ContextError(
        f"the code context {root} is too large: {what}.\nIts biggest files:\n{listing}\n"
        f"Leave them out with a line like `{example}` in {root / '.trainhubignore'} "
        "(gitignore syntax), and read data from shared storage instead."
    )


def pack_context(root: Path, max_bytes: int = MAX_CONTEXT_BYTES) -> PackedContext:
    """Pack ``root`` as tar.gz with relative names, honouring the ignore rules.

    Raises:
        ContextError: ``root`` is not a directory, or the archive would exceed ``max_bytes``
            (compressed) or ``4 * max_bytes`` (unpacked); the message names the biggest files.
    """
    if not root.is_dir():
        raise ContextError(f"the code context {root} is not a directory")
    files, skipped = collect_files(root)
    unpacked = sum(f.size_bytes for f in files)
    if unpacked > UNPACKED_FACTOR * max_bytes:
        raise _too_large(
            root,
            f"{human_bytes(unpacked)} in {len(files)} files; the limit is "
            f"{human_bytes(UNPACKED_FACTOR * max_bytes)} unpacked",
            files,
        )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6, dereference=True) as archive:
        for f in files:
            archive.add(f.source, arcname=f.path, recursive=False, filter=_anonymous)
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise _too_large(
            root,
            f"{human_bytes(len(data))} compressed; the limit is {human_bytes(max_bytes)}",
            files,
        )
    return PackedContext(data, files, skipped)


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def human_bytes(n: float) -> str:
    """``1.1 TB`` rather than ``1,099.51 GB``: decimal units, as the quota options take them."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
