"""Trial environments installed on the nodes that run them (ADR 0034): no folder is shared.

The control plane resolves a request to a lock (service/environments.py); each node that is to
run a rank of the trial installs it into a cache of its own, by a Ray task pinned to that node
(``NodeAffinitySchedulingStrategy``, not soft) that holds no CPU or GPU: the trial's slots are
not taken while uv runs. The cache is content-addressed (one folder per environment key) and
each environment is installed once per node under the builder's file lock
(adapters/envs/uv.py): a second task, or a second control plane, waits and finds it there.

The node's cache is ``--env-cache`` when given (the same path on every node, each its own),
else ``envs`` under the node's work folder. A rank finds its environment there by key
(:func:`installed_path`, called by the rank actor on its node).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainhub.adapters.envs.uv import READY_MARKER, UvEnvironments
from trainhub.adapters.ray_executor.rank_worker import node_work_root
from trainhub.core.environments import BaseIdentity, short_key
from trainhub.service.environments import BuildFailed, Installed, NodeLost

log = logging.getLogger(__name__)

INSTALL_TIMEOUT_S = 3600.0  # uv's own steps time out sooner (adapters/envs/uv.py)
REMOVE_TIMEOUT_S = 60.0


def node_env_root(configured: str | None, node_work_dir: str | None) -> Path:
    """This node's environment cache (call it on the node)."""
    return Path(configured) if configured else node_work_root(node_work_dir) / "envs"


def installed_path(configured: str | None, node_work_dir: str | None, key: str) -> str:
    """The folder of environment ``key`` on this node; raises FileNotFoundError, saying so,
    when it is not (completely) installed here."""
    target = node_env_root(configured, node_work_dir) / key
    if not (target / READY_MARKER).exists():
        raise FileNotFoundError(
            f"environment {short_key(key)} is not installed on this node ({target}); "
            "the control plane installs it before placing a trial here"
        )
    return str(target)


def _install_here(
    configured: str | None,
    node_work_dir: str | None,
    key: str,
    packages: list[str],
    base: BaseIdentity,
) -> tuple[str, str | int, bool, str]:
    """On the node: ("ok", size, built, log) or ("failed", message, False, log)."""
    builder = UvEnvironments(node_env_root(configured, node_work_dir))
    try:
        here = builder.base()
        if here.identity != base:
            raise BuildFailed(
                f"this node's Python environment (Python {here.identity.python_version}, "
                f"packages {here.identity.digest[:12]}) is not the control plane's (Python "
                f"{base.python_version}, packages {base.digest[:12]}): install the same "
                "trainhub environment on every node",
                "",
            )
        installed = builder.install(key, packages, here)
    except BuildFailed as exc:
        return "failed", exc.message, False, exc.log
    return "ok", installed.size_bytes, installed.built, installed.log


def _remove_here(configured: str | None, node_work_dir: str | None, key: str) -> None:
    UvEnvironments(node_env_root(configured, node_work_dir)).remove(key)


_install_task: Any = ray.remote(num_cpus=0, max_retries=0)(_install_here)
_remove_task: Any = ray.remote(num_cpus=0, max_retries=0)(_remove_here)


class RayNodeInstaller:
    """:class:`~trainhub.service.environments.NodeInstaller` by Ray tasks on the nodes.

    Args:
        connect: connects this process to the cluster (the executor's, idempotent).
        env_cache: the nodes' cache folder (the same path on each node); default ``envs``
            under each node's work folder.
        node_work_dir: the executor's node work folder setting (default: the node's own).
    """

    def __init__(
        self,
        connect: Any,
        env_cache: str | None = None,
        node_work_dir: str | None = None,
    ) -> None:
        self._connect = connect
        self._env_cache = env_cache
        self._node_work_dir = node_work_dir

    def install(
        self, node_id: str, key: str, packages: Sequence[str], base: BaseIdentity
    ) -> Installed:
        self._connect()
        task = _install_task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            name=f"trainhub-env-{short_key(key)}",
        )
        ref = task.remote(self._env_cache, self._node_work_dir, key, list(packages), base)
        try:
            state, value, built, output = ray.get(ref, timeout=INSTALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise BuildFailed(
                f"installing took longer than {INSTALL_TIMEOUT_S:.0f} s on node {node_id[:12]}",
                "",
            ) from None
        except ray.exceptions.RayError as exc:  # the node died, or Ray could not place it
            raise NodeLost(f"node {node_id[:12]}: {' '.join(str(exc).split())[:300]}") from exc
        if state != "ok":
            raise BuildFailed(str(value), output)
        return Installed(f"{key} on node {node_id[:12]}", int(value), bool(built), output)

    def remove(self, key: str) -> None:
        self._connect()
        refs = []
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if not node.get("Alive") or not node.get("Resources", {}).get("CPU"):
                continue
            refs.append(
                _remove_task.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ).remote(self._env_cache, self._node_work_dir, key)
            )
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=REMOVE_TIMEOUT_S)
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayError as exc:
                    log.warning("removing environment %s on a node failed: %s", key, exc)
