"""Doc tests: every block of README.md and docs/ marked runnable runs as written.

A fenced ``bash``/``sh``/``shell`` or ``python`` block right after a line
``<!-- runnable -->`` is extracted and run, in the order of its file, against a real server of
its own (a control plane process on the session's Ray head, a fresh database): shell blocks
with ``bash -euo pipefail`` (``trainhub`` on the PATH, TRAINHUB_URL and TRAINHUB_TOKEN set, a
working directory holding ``examples/``), Python blocks with the test's interpreter in the same
directory. How to mark a block: docs/writing-docs.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.control_plane import REPO, ControlPlaneProcess

MARK = "<!-- runnable -->"
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
_BLOCK = re.compile(
    r"^" + re.escape(MARK) + r"[ \t]*\n```(\w+)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S
)
_MARKS = re.compile(r"^" + re.escape(MARK) + r"[ \t]*$", re.M)  # a marker alone on its line
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    language: str  # "shell" or "python"
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def snippets(path: Path) -> list[Snippet]:
    """The runnable blocks of a Markdown file, in order; a marked block of another language is
    an error (a marker must never be silently ignored)."""
    text = path.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        language = LANGUAGES.get(match.group(1))
        line = text.count("\n", 0, match.start()) + 2
        if language is None:
            raise ValueError(f"{path}:{line}: a runnable block must be bash or python")
        found.append(Snippet(path, line, language, match.group(2)))
    if len(_MARKS.findall(text)) != len(found):
        raise ValueError(f"{path}: a {MARK} marker is not followed by a fenced block")
    return found


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _with_snippets() -> list[Path]:
    return [p for p in documents() if snippets(p)]


def test_the_marker_finds_blocks_and_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f"text\n{MARK}\n```bash\ntrainhub ls\n```\n\n```bash\nnot marked\n```\n"
        f"{MARK}\n```python\nprint(1)\n```\n"
    )
    found = snippets(page)
    assert [(s.language, s.code, s.line) for s in found] == [
        ("shell", "trainhub ls\n", 3),
        ("python", "print(1)\n", 11),
    ]
    page.write_text(f"{MARK}\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="bash or python"):
        snippets(page)
    page.write_text(f"{MARK}\n\nprose\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="not followed by a fenced block"):
        snippets(page)


def test_the_main_paths_are_marked_runnable() -> None:
    marked = {p.name: "".join(s.code for s in snippets(p)) for p in documents()}
    for command in ("trainhub submit", "trainhub ls", "trainhub show", "trainhub logs"):
        assert command in marked["README.md"], command
    assert "trainhub metrics" in marked["README.md"]
    assert "trainhub models register" in marked["models.md"]
    assert "trainhub models export" in marked["models.md"]
    assert "ctx.track_samples" in marked["debugging.md"]
    assert "trainhub debug" in marked["debugging.md"]


@pytest.fixture
def docs_plane(ray_address: str, tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlaneProcess(home, ray_address)
    plane.start()
    try:
        yield plane
    finally:
        for experiment in plane.request("GET", "/experiments").json().get("data", []):
            if experiment["state"] == "ACTIVE":
                plane.request("POST", f"/experiments/{experiment['id']}/cancel")
        plane.stop()


def _run(snippet: Snippet, cwd: Path, env: dict[str, str]) -> None:
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


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("document", _with_snippets(), ids=lambda p: p.name)
def test_the_runnable_blocks_of_a_document_run(
    document: Path, docs_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "TRAINHUB_URL": docs_plane.url,
        "TRAINHUB_TOKEN": docs_plane.token,
        "TRAINHUB_HOME": str(docs_plane.home),
        "COLUMNS": "100",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    for snippet in snippets(document):
        _run(snippet, work, env)
