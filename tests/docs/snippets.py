"""How the doc tests read and run README.md and docs/.

The tests are test_snippets.py and one test_page_*.py per page with runnable blocks, so that
pytest-xdist (which hands out whole files) spreads the pages over its workers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.control_plane import REPO, ControlPlaneProcess

MARK = "<!-- runnable -->"
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
# what a runnable block may need beyond the docs' server; anything else is a typo
NEEDS = {"needs gpu": "a GPU", "needs s3": "an S3 server"}
_MARKER = re.compile(r"^<!-- (runnable|not runnable)(?::[ \t]*(.*?))?[ \t]*-->[ \t]*$")
_FENCE = re.compile(r"^```(\S*)")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence
    language: str  # "shell" or "python"
    code: str
    needs: str = ""  # "", "needs gpu" or "needs s3"

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}"


@dataclass(frozen=True)
class Block:
    """One fenced block of a Markdown file, with the marker on the line before it, if any."""

    line: int
    language: str  # as the fence names it ("" when it names none)
    code: str
    mark: str | None  # "runnable", "not runnable" or None
    detail: str  # after the colon: what it needs, or why it cannot run


def _blocks(path: Path) -> list[Block]:
    """The fenced blocks at the start of a line; a marker not right before a fence, or a
    fence left open, is an error (a marker must never be silently ignored)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        if marker is not None:
            if i + 1 >= len(lines) or not _FENCE.match(lines[i + 1]):
                raise ValueError(f"{path}:{i + 1}: a marker is not followed by a fenced block")
            i += 1
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a fenced block is never closed")
        found.append(
            Block(
                i + 1,
                fence.group(1),
                "".join(f"{line}\n" for line in lines[i + 1 : end]),
                marker.group(1) if marker else None,
                (marker.group(2) or "").strip() if marker else "",
            )
        )
        i = end + 1
    return found


def snippets(path: Path) -> list[Snippet]:
    """The runnable blocks of a Markdown file, in order; a runnable marker on a block of
    another language, or naming a need that is not one of :data:`NEEDS`, is an error."""
    found = []
    for block in _blocks(path):
        if block.mark != "runnable":
            continue
        language = LANGUAGES.get(block.language)
        if language is None:
            raise ValueError(f"{path}:{block.line}: a runnable block must be bash or python")
        if block.detail and block.detail not in NEEDS:
            raise ValueError(
                f"{path}:{block.line}: '{block.detail}': a runnable block may name "
                f"{' or '.join(NEEDS)}"
            )
        found.append(Snippet(path, block.line, language, block.code, block.detail))
    return found


def undecided(path: Path) -> list[str]:
    """What a page leaves unchecked: a fence naming no language, a command or script block
    marked neither runnable nor not runnable, a "not runnable" without its reason."""
    problems = []
    for block in _blocks(path):
        where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{block.line}"
        if not block.language:
            problems.append(f"{where}: name the block's language (`text` for output)")
        elif block.language in LANGUAGES and block.mark is None:
            problems.append(
                f"{where}: mark the {block.language} block {MARK}, or "
                "<!-- not runnable: WHY --> where it cannot run as written"
            )
        elif block.mark == "not runnable" and not block.detail:
            problems.append(f"{where}: say why the block is not runnable")
    return problems


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def plain(path: Path) -> list[Snippet]:
    return [s for s in snippets(path) if not s.needs]


def with_snippets() -> list[Path]:
    return [p for p in documents() if plain(p)]


def needing() -> list[Snippet]:
    return [s for p in documents() for s in snippets(p) if s.needs]


def run(snippet: Snippet, cwd: Path, env: dict[str, str]) -> None:
    if snippet.language == "shell":
        argv = ["bash", "-euo", "pipefail", "-c", snippet.code]
    else:
        script = cwd / f"snippet_{snippet.line}.py"
        script.write_text(snippet.code)
        argv = [sys.executable, str(script)]
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{snippet} exited {done.returncode}\n--- block\n{snippet.code}--- stdout\n"
        f"{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}"
    )


def workspace(plane: ControlPlaneProcess, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "TRAINHUB_URL": plane.url,
        "TRAINHUB_TOKEN": plane.token,
        "TRAINHUB_HOME": str(plane.home),
        "COLUMNS": "100",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    return work, env


def run_document(name: str, plane: ControlPlaneProcess, tmp_path: Path) -> None:
    """Every plain runnable block of one page, in order, against one server of its own."""
    work, env = workspace(plane, tmp_path)
    for snippet in plain(REPO / name if name == "README.md" else REPO / "docs" / name):
        run(snippet, work, env)
