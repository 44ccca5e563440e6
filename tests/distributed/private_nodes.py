"""A cluster with no shared folder on one machine: a control-plane "host" and worker "hosts",
each a network namespace of its own with folders no other one sees.

    with private_cluster(workers=2, env={...}) as cluster:
        lines = cluster.run_driver(["-m", "tests.distributed.noshare_driver", ...])

Namespace ``cp`` holds a bridge (``10.78.0.1``) and the Ray head (no CPU: nothing runs there
but the control plane the driver starts); worker ``i`` (``10.78.0.{i+2}``) a Ray node with
``cpus_per_node`` CPUs, joined to the bridge by a veth pair. Nothing else is reachable.

Each host has a folder under the cluster's root (``cp``, ``n1``, ``n2``...) for its HOME, temp
files, node work folder and Ray's files, and every process of a host runs in a mount namespace
of its own (``ip netns exec`` makes one) where the other hosts' folders are covered by an empty
tmpfs: a rank cannot read what the control plane or another node wrote, and the control plane
cannot read the nodes'. Ray's session folder, which worker nodes take from the head, lands in
each node's own tmpfs. The code installation (this repository and its virtual environment) is
what every host has, as an image would.

Clean-up kills the processes of every namespace (``ip netns pids``), deletes the namespaces and
the root folder. Needs root and ``ip``; :func:`tests.distributed.netns.unavailable_reason`.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.distributed.netns import (
    REPO_ROOT,
    _ip,
    _kill_namespace_processes,
    ray_start_in_namespace,
)

CP_IP = "10.78.0.1"
RAY_PORT = 6380
IFNAME = "th0"
BRIDGE = "thbr0"


def worker_ip(index: int) -> str:
    return f"10.78.0.{index + 2}"


@dataclass
class Host:
    name: str  # "cp", "n1", "n2", ...
    namespace: str
    ip: str
    folder: Path  # its private folder: HOME, tmp, work, ...

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def tmp(self) -> Path:
        return self.folder / "tmp"

    @property
    def work(self) -> Path:
        return self.folder / "work"


@dataclass
class PrivateCluster:
    root: Path
    control: Host
    workers: list[Host]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def hosts(self) -> list[Host]:
        return [self.control, *self.workers]

    @property
    def ray_address(self) -> str:
        return f"{CP_IP}:{RAY_PORT}"

    def host_env(self, host: Host) -> dict[str, str]:
        env = {
            **self.env,
            "HOME": str(host.home),
            "TMPDIR": str(host.tmp),
            "TRAINHUB_NODE_WORK_DIR": str(host.work),
        }
        return env

    def argv(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` in the host's network namespace, with the other hosts' folders covered."""
        others = [h.folder for h in self.hosts if h is not host]
        covers = " && ".join(f"mount -t tmpfs none {shlex.quote(str(f))}" for f in others)
        script = f'{covers} && exec "$@"'
        return ["ip", "netns", "exec", host.namespace, "sh", "-c", script, "sh", *argv]

    def worker_by_ip(self, ip: str) -> Host:
        return next(h for h in self.workers if h.ip == ip)

    def kill(self, host: Host) -> None:
        """The host dies: every process in its namespace is killed (Ray's too)."""
        _kill_namespace_processes(host.namespace)

    def run_driver(
        self, python_args: Sequence[str], *, env: Mapping[str, str] | None = None,
        timeout_s: float = 900,
    ) -> list[dict[str, object]]:  # fmt: skip
        """Run ``python python_args`` on the control-plane host; the JSON lines it printed
        (each echoed to stderr as it arrives)."""
        full_env = {**self.host_env(self.control), **dict(env or {})}
        proc = subprocess.Popen(
            self.argv(self.control, [sys.executable, *python_args]),
            env=full_env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        lines: list[dict[str, object]] = []
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                lines.append(json.loads(line))
                print(line, end="", file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                proc.kill()
                break
        _, stderr = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"driver exited with {proc.returncode}:\n{stderr[-6000:]}")
        return lines


def _setup_network(cluster: PrivateCluster, tag: str) -> None:
    cp = cluster.control.namespace
    for host in cluster.hosts:
        _ip("netns", "add", host.namespace)
        _ip("-n", host.namespace, "link", "set", "lo", "up")
    _ip("-n", cp, "link", "add", BRIDGE, "type", "bridge")
    _ip("-n", cp, "addr", "add", f"{CP_IP}/24", "dev", BRIDGE)
    _ip("-n", cp, "link", "set", BRIDGE, "up")
    for index, host in enumerate(cluster.workers):
        near, far = f"v{tag}{index}a", f"v{tag}{index}b"
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        _ip("link", "set", near, "netns", cp)
        _ip("-n", cp, "link", "set", near, "master", BRIDGE)
        _ip("-n", cp, "link", "set", near, "up")
        _ip("link", "set", far, "netns", host.namespace)
        _ip("-n", host.namespace, "link", "set", far, "name", IFNAME)
        _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", IFNAME)
        _ip("-n", host.namespace, "link", "set", IFNAME, "up")


def _ray_start(cluster: PrivateCluster, host: Host, args: list[str]) -> None:
    ray = Path(sys.executable).with_name("ray")
    argv = cluster.argv(host, [str(ray), "start", *args])
    log = cluster.root / f"ray-start-{host.name}.log"
    ray_start_in_namespace(host.namespace, argv, cluster.host_env(host), log, 420)


@contextmanager
def private_cluster(
    *,
    workers: int = 2,
    cpus_per_node: int = 2,
    object_store_mb: int = 200,
    env: Mapping[str, str] | None = None,
) -> Iterator[PrivateCluster]:
    """The namespaces, the bridge, each host's private folder and a Ray cluster (a head on the
    control-plane host, ``workers`` nodes); all of it torn down after."""
    tag = uuid.uuid4().hex[:5]
    root = Path(tempfile.mkdtemp(prefix="thpn-", dir="/tmp"))  # short: Ray's socket paths
    hosts = [Host("cp", f"thc{tag}", CP_IP, root / "cp")] + [
        Host(f"n{i + 1}", f"thn{i + 1}{tag}", worker_ip(i), root / f"n{i + 1}")
        for i in range(workers)
    ]
    for host in hosts:
        for folder in (host.home, host.tmp, host.work):
            folder.mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "GLOO_", "AWS_"))}
    base.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), base.get("PYTHONPATH", "")]).strip(":"),
            "GLOO_SOCKET_IFNAME": IFNAME,
            "RAY_USAGE_STATS_ENABLED": "0",
            # a node's raylet registers in 30 s by default: too short beside a loaded suite
            "RAY_raylet_start_wait_time_s": "120",
            "OMP_NUM_THREADS": "1",
            # a dead node is noticed in seconds, not half a minute (read by the head's GCS)
            "RAY_health_check_initial_delay_ms": "1000",
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
            **dict(env or {}),
        }
    )
    # token authentication on, with a token of this cluster's own (readable by every host)
    token_file = root / "auth_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    base["RAY_AUTH_MODE"] = "token"
    base["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    cluster = PrivateCluster(root, hosts[0], hosts[1:], base)
    common = [f"--object-store-memory={object_store_mb * 1024 * 1024}", "--disable-usage-stats"]
    try:
        _setup_network(cluster, tag)
        # the control plane's Ray files live in its folder; the workers take that path from
        # the head and find their own empty tmpfs there
        _ray_start(
            cluster,
            cluster.control,
            ["--head", f"--node-ip-address={CP_IP}", f"--port={RAY_PORT}", "--num-cpus=0",
             "--include-dashboard=false", f"--temp-dir={cluster.control.folder / 'ray'}",
             *common],
        )  # fmt: skip
        for host in cluster.workers:
            _ray_start(
                cluster,
                host,
                [f"--address={cluster.ray_address}", f"--node-ip-address={host.ip}",
                 f"--num-cpus={cpus_per_node}", *common],
            )  # fmt: skip
        yield cluster
    finally:
        for host in cluster.hosts:
            _kill_namespace_processes(host.namespace)
            _ip("netns", "del", host.namespace, check=False)
        shutil.rmtree(root, ignore_errors=True)
