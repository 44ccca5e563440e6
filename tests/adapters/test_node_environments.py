"""Environments installed by a Ray task on the node (adapters/ray_executor/node_environments.py),
on the session's Ray head: once per node under the builder's lock, found by key by the rank's
side, refused where the node's base is not the control plane's, removed from every node.

The environments here hold no package beyond the base (no index is needed: the venv and its
layering over the base are what the node builds); tests/service/test_node_environments.py and
tests/distributed/test_no_shared_folder.py install packages from an index.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.fixtures.ray_cluster import TEST_NAMESPACE
from trainhub.adapters.envs.uv import UvEnvironments
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.adapters.ray_executor.executor import connect
from trainhub.adapters.ray_executor.node_environments import RayNodeInstaller, installed_path
from trainhub.core.environments import BaseIdentity
from trainhub.service.environments import BuildFailed

pytestmark = [pytest.mark.ray]


def test_a_node_installs_an_environment_once_and_a_rank_finds_it_by_key(
    ray_address: str, ray_executor: RayExecutor, tmp_path: Path
) -> None:
    cache = tmp_path / "node-envs"
    installer = RayNodeInstaller(lambda: connect(ray_address, TEST_NAMESPACE), str(cache))
    node = next(n.node_id for n in ray_executor.cluster_nodes() if n.total_cpus > 0)
    base = UvEnvironments(cache).base().identity
    key = "e" * 64
    with pytest.raises(FileNotFoundError, match="is not installed on this node"):
        installed_path(str(cache), None, key)

    results = []

    def install() -> None:
        results.append(installer.install(node, key, [], base))

    threads = [threading.Thread(target=install) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert sorted(r.built for r in results) == [False, True]  # one built, one found it
    assert all(r.size_bytes > 0 for r in results)
    path = Path(installed_path(str(cache), None, key))
    assert path == cache / key
    assert list(path.glob("lib/python*/site-packages/_trainhub_base.pth"))

    installer.remove(key)
    assert not path.exists()


def test_a_node_whose_base_differs_refuses_to_install(
    ray_address: str, ray_executor: RayExecutor, tmp_path: Path
) -> None:
    cache = tmp_path / "node-envs"
    installer = RayNodeInstaller(lambda: connect(ray_address, TEST_NAMESPACE), str(cache))
    node = next(n.node_id for n in ray_executor.cluster_nodes() if n.total_cpus > 0)
    other = BaseIdentity("3.0.1", "0" * 64)
    with pytest.raises(BuildFailed, match="is not the control plane's"):
        installer.install(node, "f" * 64, [], other)
    assert not (cache / ("f" * 64)).exists()
