"""Doc tests: every command and script of README.md and docs/ runs as written, or says why not.

A fenced ``bash``/``sh``/``shell`` or ``python`` block right after a line
``<!-- runnable -->`` is extracted and run, in the order of its file, against a real server of
its own (a control plane process on the session's Ray head, a fresh database): shell blocks
with ``bash -euo pipefail`` (``trainhub`` on the PATH, TRAINHUB_URL and TRAINHUB_TOKEN set, a
working directory holding ``examples/``), Python blocks with the test's interpreter in the same
directory. ``<!-- runnable: needs gpu -->`` and ``<!-- runnable: needs s3 -->`` blocks run
alone, where a GPU or an S3 server (SeaweedFS, the tests' own) is there, and skip with that
reason elsewhere. Every other such block says why it cannot run (``<!-- not runnable: WHY
-->``), and every fence names its language (``text`` for output): a command cannot slip into
the docs unchecked. How to mark a block: docs/writing-docs.md.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from tests.docs.snippets import (
    MARK,
    Snippet,
    documents,
    needing,
    run,
    snippets,
    undecided,
    with_snippets,
    workspace,
)
from tests.fixtures.control_plane import ControlPlaneProcess


def test_the_marker_finds_blocks_and_refuses_what_it_cannotrun(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f"text\n{MARK}\n```bash\ntrainhub ls\n```\n\n```bash\nnot marked\n```\n"
        f"{MARK}\n```python\nprint(1)\n```\n"
        "<!-- runnable: needs gpu -->\n```bash\nnvidia-smi\n```\n"
        "<!-- not runnable: starts a server -->\n```bash\ntrainhub server\n```\n```\nout\n```\n"
    )
    found = snippets(page)
    assert [(s.language, s.code, s.line, s.needs) for s in found] == [
        ("shell", "trainhub ls\n", 3, ""),
        ("python", "print(1)\n", 11, ""),
        ("shell", "nvidia-smi\n", 15, "needs gpu"),
    ]
    assert undecided(page) == [
        f"{page}:7: mark the bash block {MARK}, or <!-- not runnable: WHY --> where it cannot "
        "run as written",
        f"{page}:22: name the block's language (`text` for output)",
    ]
    page.write_text(f"{MARK}\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="bash or python"):
        snippets(page)
    page.write_text(f"{MARK}\n\nprose\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="not followed by a fenced block"):
        snippets(page)
    page.write_text("<!-- runnable: needs tpu -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="may name needs gpu or needs s3"):
        snippets(page)
    page.write_text("<!-- not runnable -->\n```bash\nls\n```\n")
    assert undecided(page) == [f"{page}:2: say why the block is not runnable"]


def test_every_command_and_script_of_the_docs_runs_or_says_why_not() -> None:
    problems = [p for path in documents() for p in undecided(path)]
    assert not problems, "\n".join(problems)
    for path in documents():
        snippets(path)  # and every marker is one the runner understands


def test_the_main_paths_are_marked_runnable() -> None:
    marked = {p.name: "".join(s.code for s in snippets(p)) for p in documents()}
    for command in ("trainhub submit", "trainhub ls", "trainhub show", "trainhub logs"):
        assert command in marked["README.md"], command
    assert "trainhub metrics" in marked["README.md"]
    assert "trainhub data push" in marked["README.md"]
    assert "trainhub models register" in marked["models.md"]
    assert "trainhub models export" in marked["models.md"]
    assert "ctx.track_samples" in marked["debugging.md"]
    assert "trainhub debug" in marked["debugging.md"]
    assert "trainhub data share" in marked["data.md"]
    assert "trainhub storage migrate" in marked["storage.md"]


def test_every_page_with_runnable_blocks_has_its_test_file() -> None:
    """Each page runs in a test file of its own (pytest-xdist hands out whole files): a page
    that gains runnable blocks needs a ``test_page_*.py`` naming it, or its blocks never run."""
    here = Path(__file__).parent
    named = {
        m.group(1)
        for f in here.glob("test_page_*.py")
        for m in [re.search(r'^PAGE = "([^"]+)"', f.read_text(), re.M)]
        if m
    }
    assert {p.name for p in with_snippets()} <= named, "add tests/docs/test_page_NAME.py"


def _gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("snippet", needing(), ids=str)
def test_a_block_that_needs_a_gpu_or_s3_runs_where_there_is_one(
    snippet: Snippet, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Alone, against a server of its own: the credentials and endpoint of the tests' S3
    server (SeaweedFS, its bucket ``ml-artifacts`` made) for ``needs s3``."""
    if snippet.needs == "needs gpu" and not _gpu():
        pytest.skip(f"{snippet} needs a GPU; this machine has none")
    extra: dict[str, str] = {}
    if snippet.needs == "needs s3":
        seaweed = request.getfixturevalue("seaweed")  # skips, saying why, where it cannot start
        from botocore.exceptions import ClientError

        with contextlib.suppress(ClientError):  # made by an earlier block
            seaweed.client().create_bucket(Bucket="ml-artifacts")
        extra = {**seaweed.env, "TRAINHUB_S3_ENDPOINT": seaweed.endpoint}
    plane: ControlPlaneProcess = request.getfixturevalue("docs_plane")
    work, env = workspace(plane, tmp_path)
    run(snippet, work, {**env, **extra})
