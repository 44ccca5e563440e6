"""A network namespace per trial (on each node), and the one way out of it: the control plane's API.

The ranks of one attempt on one node share a network namespace that has a loopback interface
and nothing else: no route to the host, to the cluster or to the internet. They rendezvous and
run their collectives over its loopback (``MASTER_ADDR=127.0.0.1``, ``GLOO_SOCKET_IFNAME=lo``).
The control plane's API is the one thing outside they reach: an :class:`ApiRelay` of the rank
actor listens *inside* the namespace on the API's address and port and forwards each connection
to the real API from the host's namespace. Nothing else of the host is reachable: not Ray's
ports, not the database on 127.0.0.1:5432 (the namespace's 127.0.0.1 is its own), not another
trial's rendezvous store, not a host abstract unix socket (those belong to a network namespace).

The namespace is made as ``ip netns add`` makes it, without its process: a thread enters a new
namespace (``unshare``), brings its loopback up and bind-mounts it to a name under /run/netns
that the actor of every rank of the attempt on the node can open (and ``ip netns`` lists); a
rank's process joins it between fork and exec (``setns``), before bwrap starts. docs/adr/0027
says why this and not a veth pair.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

NETNS_DIR = Path("/run/netns")
READY_DIR = Path("/run/trainhub/netns-ready")
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_LIBC.unshare.argtypes = [ctypes.c_int]
_LIBC.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class NetworkUnavailable(RuntimeError):
    """No network namespace can be made here (no root, no ``ip``)."""


def namespace_name(attempt_id: str) -> str:
    """The netns name of one attempt (``ip netns`` names: letters, digits, ``-_.``)."""
    return "th-" + re.sub(r"[^A-Za-z0-9_.-]", "_", attempt_id)[:200]


def network_problem() -> str | None:
    """Why a trial network cannot be made on this node (None when it can)."""
    if os.geteuid() != 0:
        return "per-trial networks need a root node agent (namespaces named under /run/netns)"
    probe = TrialNetwork(f"th-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        TrialNetwork.ensure(probe.name, [])
    except OSError as exc:
        return f"cannot make a network namespace here: {exc}"
    finally:
        probe.remove()
    return None


class TrialNetwork:
    """The network namespace of one attempt's ranks on this node."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = NETNS_DIR / name

    @property
    def ready_path(self) -> Path:
        """Made once the namespace is complete (its tunnel too): what other ranks wait for."""
        return READY_DIR / self.name

    @classmethod
    def ensure(
        cls,
        name: str,
        addresses: list[str],
        timeout_s: float = 10.0,
        then: Callable[[TrialNetwork], None] | None = None,
    ) -> TrialNetwork:
        """The namespace ``name``: made (loopback up, ``addresses`` on it, then ``then`` done
        to it: a tunnel) by the first rank of the node to ask, waited for by the others."""
        network = cls(name)
        NETNS_DIR.mkdir(parents=True, exist_ok=True)
        READY_DIR.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(network.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
        except FileExistsError:  # another rank makes it: ready once it says so
            network.wait_made(timeout_s)
            return network
        extra = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
        try:
            _in_new_namespace(lambda: _set_up(network.path, extra))
            if then is not None:
                then(network)
            network.ready_path.touch()
        except BaseException:
            network.remove()
            raise
        return network

    def wait_made(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not (self.ready_path.exists() and os.path.ismount(self.path)):
            if time.monotonic() > deadline:
                raise NetworkUnavailable(f"{self.path} was not made in {timeout_s} s")
            time.sleep(0.005)

    def open(self) -> int:
        """A descriptor of the namespace, for :func:`join` in a forked child."""
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def remove(self) -> None:
        """Forget the name (the namespace itself ends with its last process and socket)."""
        _LIBC.umount2(bytes(self.path), MNT_DETACH)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.ready_path.unlink()


def join(fd: int) -> None:
    """Move the calling thread (a forked child: the whole process) into the namespace ``fd``."""
    if _LIBC.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into the trial's network namespace")


class ApiRelay:
    """Forwards TCP connections made inside a trial's namespace to the API outside it.

    Listens on ``listen`` inside the namespace (its socket is made by a thread that entered the
    namespace for that alone), connects to ``target`` from the host's namespace, and copies
    bytes both ways until either side closes. Only this one address and port are relayed.
    """

    def __init__(self, network: TrialNetwork, listen: tuple[str, int], target: tuple[str, int]):
        self._target = target
        self._count_lock = threading.Lock()
        self.bytes = 0  # copied either way: they crossed the namespace's loopback once
        self._server = _listen_inside(network, listen)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="api-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes += n

    def _accept(self) -> None:
        while not self._closed:
            try:
                inside, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(inside,), daemon=True).start()

    def _serve(self, inside: socket.socket) -> None:
        try:
            outside = socket.create_connection(self._target, timeout=30)
        except OSError:
            inside.close()
            return
        outside.settimeout(None)
        for sock in (inside, outside):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(target=_pump, args=(outside, inside, self._count), daemon=True)
        back.start()
        _pump(inside, outside, self._count)
        back.join()
        inside.close()
        outside.close()


def _pump(
    source: socket.socket, sink: socket.socket, count: Callable[[int], None] | None = None
) -> None:
    """Copy until ``source`` ends, then end ``sink``'s writing half (HTTP keep-alive safe)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
            if count is not None:
                count(len(data))
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _set_up(path: Path, addresses: list[str]) -> None:
    """In a thread of the new namespace: loopback up, extra addresses on it, then the name."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
    for address in addresses:  # rare (an API on a non-loopback address): `ip` forks in here
        ip = _ip()
        if ip is None:
            raise NetworkUnavailable("no `ip` command to add the API's address (iproute2)")
        done = subprocess.run(
            [ip, "address", "add", f"{address}/32", "dev", "lo"], capture_output=True, check=False
        )
        if done.returncode != 0:
            raise NetworkUnavailable(f"ip address add {address}: {done.stderr.decode().strip()}")
    if _LIBC.mount(b"/proc/thread-self/ns/net", bytes(path), None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mount the trial's network namespace to {path}")


def _in_new_namespace(action: Callable[[], None]) -> None:
    """Run ``action`` in a thread that entered a new network namespace (and then ends)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            if _LIBC.unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare a network namespace")
            action()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="trial-network")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _listen_inside(network: TrialNetwork, address: tuple[str, int]) -> socket.socket:
    """A listening socket of the trial's namespace (a socket keeps the namespace it was made in)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_listen() -> None:
        try:
            fd = network.open()
            try:
                join(fd)  # this thread only; it ends right after
            finally:
                os.close(fd)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(address)
            server.listen(128)
            made.append(server)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=enter_and_listen, name="api-relay-listen")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def _ip() -> str | None:
    return shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin")
