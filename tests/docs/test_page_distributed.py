"""Every runnable block of distributed.md runs as written, in order, against a server of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.snippets import run_document
from tests.fixtures.control_plane import ControlPlaneProcess
from trainhub.data.mnist import default_root

PAGE = "distributed.md"
pytestmark = pytest.mark.skipif(
    default_root() is None,
    reason="the page's script loads MNIST: the shared MNIST files (../shared/data/mnist) "
    "are not on this machine",
)


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
def test_the_runnable_blocks_of_the_page_run(
    docs_plane: ControlPlaneProcess, tmp_path: Path
) -> None:
    run_document(PAGE, docs_plane, tmp_path)
