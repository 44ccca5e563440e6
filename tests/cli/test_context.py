"""Packing the code context: ignore files like git, always-excluded paths, the size limit."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from trainhub.cli.context import ContextError, pack_context
from trainhub.service.context_archive import check_context


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def names_in(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return {m.name for m in archive.getmembers() if m.isfile()}


def test_gitignore_trainhubignore_and_nested_rules(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "train.py": "print(1)\n",
            "experiment.yaml": "name: x\n",
            ".gitignore": "data/\n*.log\n/outputs\n",
            ".trainhubignore": "secret.txt\n!keep.log\n",
            "data/big.bin": b"x" * 100,
            "run.log": "log\n",
            "keep.log": "kept by a negation in .trainhubignore\n",
            "secret.txt": "s\n",
            "outputs/model.pt": b"m",
            "pkg/outputs/notes.md": "anchored /outputs only matches at the root\n",
            "pkg/__init__.py": "",
            "pkg/.gitignore": "scratch.py\n",
            "pkg/scratch.py": "",
            "scratch.py": "only pkg/.gitignore names it, so this one stays\n",
            "pkg/__pycache__/mod.cpython-311.pyc": b"\0",
            "stale.pyc": b"\0",
            ".git/config": "[core]\n",
            ".venv/bin/python": "",
            "sub/.git/HEAD": "ref\n",
        },
    )
    packed = pack_context(tmp_path)
    expected = {
        "train.py",
        "experiment.yaml",
        ".gitignore",
        ".trainhubignore",
        "keep.log",
        "pkg/outputs/notes.md",
        "pkg/__init__.py",
        "pkg/.gitignore",
        "scratch.py",
    }
    assert packed.names == expected
    assert names_in(packed.data) == expected
    assert check_context(packed.data) == expected  # the server accepts it as is


def test_always_excluded_paths_cannot_be_re_included(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "", ".gitignore": "!.git/\n!*.pyc\n", ".git/x": "", "b.pyc": b""})
    assert pack_context(tmp_path).names == {"a.py", ".gitignore"}


def test_links_to_files_are_packed_as_files_and_links_to_directories_skipped(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    write(outside, {"shared.py": "X = 1\n", "dir/y.py": ""})
    root = tmp_path / "ctx"
    write(root, {"train.py": ""})
    os.symlink(outside / "shared.py", root / "shared.py")
    os.symlink(outside / "dir", root / "linked")
    os.symlink(root / "nowhere", root / "broken.py")
    packed = pack_context(root)
    assert packed.names == {"train.py", "shared.py"}
    assert any("linked/" in s for s in packed.skipped)
    assert any("broken.py" in s for s in packed.skipped)
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as archive:
        member = archive.getmember("shared.py")
        assert member.isfile()
        extracted = archive.extractfile(member)
        assert extracted is not None
        assert extracted.read() == b"X = 1\n"
    check_context(packed.data)


def test_too_large_names_the_biggest_files(tmp_path: Path) -> None:
    write(
        tmp_path,
        {"train.py": "", "data/huge.bin": os.urandom(60_000), "weights.pt": os.urandom(30_000)},
    )
    with pytest.raises(ContextError) as info:
        pack_context(tmp_path, max_bytes=20_000)
    message = str(info.value)
    assert "too large" in message
    assert "limit" in message
    assert message.index("data/huge.bin") < message.index("weights.pt")
    assert ".trainhubignore" in message
    assert "`data/`" in message


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ContextError, match="not a directory"):
        pack_context(tmp_path / "missing")
