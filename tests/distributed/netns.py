"""Two "hosts" on one machine: network namespaces joined by a rate-limited veth pair, each with a
Ray node.

    with two_host_cluster(rate="1gbit") as cluster:
        result = cluster.run_driver(["-m", "tests.distributed.two_host", "--job", job_json])

Namespace A holds the Ray head (``10.77.0.1``), namespace B a worker node (``10.77.0.2``); the
veth pair is the only link between them, shaped by ``tc ... tbf`` in both directions, and neither
namespace has a route anywhere else, so all traffic stays between the two addresses. Both ends
of the pair are called ``th0`` inside their namespace (``GLOO_SOCKET_IFNAME=th0`` works on both
hosts). Ray's ports live in the namespaces' own network stacks, so they cannot clash with a Ray
head the test session runs on the host; Ray's files go to a temporary directory of our own.

Clean-up kills exactly the processes inside our two namespaces (``ip netns pids``), then deletes
the namespaces (which deletes the veth pair). Needs root and ``ip``/``tc``;
:func:`unavailable_reason` says why not where they are missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

HEAD_IP = "10.77.0.1"
WORKER_IP = "10.77.0.2"
RAY_PORT = 6380
IFNAME = "th0"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str | None:
    """Why two namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"thprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class TwoHostCluster:
    """Namespaces ``ns_a`` (Ray head) and ``ns_b`` (Ray worker node), and their Ray cluster."""

    ns_a: str
    ns_b: str
    temp_dir: Path
    rate: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{RAY_PORT}"

    def exec_argv(self, namespace: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", namespace, *argv]

    def run_driver(
        self, python_args: Sequence[str], *, timeout_s: float = 900, stream: bool = False
    ) -> list[dict[str, object]]:
        """Run ``python python_args`` in namespace A against the cluster; the JSON lines it
        printed. With ``stream`` each line is echoed to stderr as it arrives."""
        env = {**self.env, "RAY_ADDRESS": self.address}
        argv = self.exec_argv(self.ns_a, [sys.executable, *python_args])
        proc = subprocess.Popen(
            argv, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        lines: list[dict[str, object]] = []
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                lines.append(json.loads(line))
                if stream:
                    print(line, end="", file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                proc.kill()
                break
        _, stderr = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"driver exited with {proc.returncode}:\n{stderr[-4000:]}")
        return lines


def _setup_namespaces(ns_a: str, ns_b: str, rate: str) -> None:
    veth_a, veth_b = f"{ns_a}v"[:15], f"{ns_b}v"[:15]
    _ip("netns", "add", ns_a)
    _ip("netns", "add", ns_b)
    _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
    for ns, veth, address in ((ns_a, veth_a, HEAD_IP), (ns_b, veth_b, WORKER_IP)):
        _ip("link", "set", veth, "netns", ns)
        _ip("-n", ns, "link", "set", veth, "name", IFNAME)
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", IFNAME)
        _ip("-n", ns, "link", "set", IFNAME, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFNAME, "root", "tbf",
             "rate", rate, "burst", "256kb", "latency", "50ms"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip


def _kill_namespace_processes(namespace: str) -> None:
    """SIGTERM, then SIGKILL, every process in ``namespace`` (all of them were started here)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        if not pids:
            return
        for pid in pids:
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), sig)
        for _ in range(50):
            if not _ip("netns", "pids", namespace, check=False).stdout.split():
                return
            time.sleep(0.1)


def ray_start_in_namespace(
    namespace: str, argv: list[str], env: dict[str, str], log: Path, timeout_s: float
) -> None:
    """``ray start`` (``argv``, run inside ``namespace``): one start at a time on the machine
    (the lock trainhub's own heads take), and once more after a start that timed out, the
    namespace's leftovers killed first (the suite's machine is small and busy)."""
    from trainhub.adapters.ray_executor.local_cluster import (
        START_ATTEMPTS,
        one_ray_start_at_a_time,
        start_timed_out,
    )

    for attempt in range(START_ATTEMPTS):
        with log.open("wb") as out, one_ray_start_at_a_time():
            result = subprocess.run(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, timeout=timeout_s, check=False,
            )  # fmt: skip
        if result.returncode == 0:
            return
        output = log.read_text(errors="replace")
        if attempt + 1 == START_ATTEMPTS or not start_timed_out(output):
            raise RuntimeError(f"ray start in {namespace} failed: {output[-3000:]}")
        _kill_namespace_processes(namespace)


def _ray_start(cluster: TwoHostCluster, namespace: str, args: list[str], name: str) -> None:
    ray = Path(sys.executable).with_name("ray")
    argv = cluster.exec_argv(namespace, [str(ray), "start", *args])
    ray_start_in_namespace(namespace, argv, cluster.env, cluster.temp_dir / f"{name}.log", 180)


@contextmanager
def two_host_cluster(
    *, rate: str = "1gbit", cpus_per_node: int = 1, object_store_mb: int = 256
) -> Iterator[TwoHostCluster]:
    """Make the namespaces, the link and a two-node Ray cluster; tear all of it down after."""
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"tha{tag}", f"thb{tag}"
    temp_dir = Path(tempfile.mkdtemp(prefix="thns-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "GLOO_"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).strip(":"),
            "GLOO_SOCKET_IFNAME": IFNAME,
            "RAY_USAGE_STATS_ENABLED": "0",
            # a node's raylet registers in 30 s by default: too short beside a loaded suite
            "RAY_raylet_start_wait_time_s": "120",
            "OMP_NUM_THREADS": "1",
        }
    )
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "disabled":
        # token authentication stays on, with a token of this cluster's own: a fresh machine
        # (an empty HOME, no ~/.ray/auth_token) works, and no other cluster's token is read
        token_file = temp_dir / "auth_token"
        token_file.write_text(secrets.token_hex(32))
        token_file.chmod(0o600)
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    cluster = TwoHostCluster(ns_a, ns_b, temp_dir, rate, env)
    common = [
        f"--num-cpus={cpus_per_node}",
        f"--object-store-memory={object_store_mb * 1024 * 1024}",
        "--disable-usage-stats",
    ]
    try:
        _setup_namespaces(ns_a, ns_b, rate)
        _ray_start(
            cluster,
            ns_a,
            [
                "--head",
                f"--node-ip-address={HEAD_IP}",
                f"--port={RAY_PORT}",
                "--include-dashboard=false",
                f"--temp-dir={temp_dir / 'a'}",
                *common,
            ],
            "head",
        )
        _ray_start(
            cluster,
            ns_b,
            [f"--address={cluster.address}", f"--node-ip-address={WORKER_IP}", *common],
            "worker",
        )
        yield cluster
    finally:
        for namespace in (ns_a, ns_b):
            _kill_namespace_processes(namespace)
            _ip("netns", "del", namespace, check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)
