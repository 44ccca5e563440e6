"""Every runnable block of models.md runs as written, in order, against a server of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.snippets import run_document
from tests.fixtures.control_plane import ControlPlaneProcess

PAGE = "models.md"


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_the_runnable_blocks_of_the_page_run(
    docs_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    run_document(PAGE, docs_plane, tmp_path)
