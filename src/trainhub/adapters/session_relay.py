"""The relay to a session's server from another host (ADR 0041), and its handshake.

A session's server listens on a unix socket in its attempt's spool folder on the node
(runtime/session_server.py); the control plane's proxy reaches it directly only when it runs on
that node. Everywhere else, rank 0's actor (rank_worker.py) serves a :class:`RelayServer`: a TCP
listener on the node's cluster address whose connections, once authenticated, are spliced to the
socket byte for byte (HTTP, WebSocket upgrades, anything).

The handshake proves knowledge of the relay's secret without sending it::

    relay  -> client   b"trainhub-relay/1 <64 hex: a fresh nonce>\\n"
    client -> relay    b"<64 hex: HMAC-SHA256(secret, b'trainhub-relay/1' + nonce)>\\n"
    relay  -> client   b"ok\\n"  (then the socket's bytes)  |  b"refused\\n" / b"unavailable ...\\n"

The secret is made by the actor (never in the rank's environment or its sandbox) and handed to
the control plane over Ray; a nonce per connection makes a recorded handshake useless. Nothing
is sent by the relay after ``ok`` until the client sends its request, so the client reads the
handshake without ever reading past it.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path

PROTOCOL = b"trainhub-relay/1"
OK = b"ok"
MAX_LINE = 256
HANDSHAKE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512  # one browser tab of JupyterLab holds a handful
_CHUNK = 1 << 16
_MAX_UNIX_PATH = 100  # sun_path's 108 bytes; longer paths are reached through /proc/self/fd


class RelayRefused(ConnectionError):
    """The relay refused the connection (a wrong secret) or could not reach the server."""


def new_secret() -> str:
    return secrets.token_hex(32)


def challenge_line() -> tuple[bytes, bytes]:
    """(the line the relay sends, its nonce)."""
    nonce = os.urandom(32)
    return PROTOCOL + b" " + nonce.hex().encode() + b"\n", nonce


def answer_for(secret: str, challenge: bytes) -> bytes:
    """The client's line for the relay's ``challenge`` line (RelayRefused if malformed)."""
    protocol, _, nonce_hex = challenge.strip().partition(b" ")
    if protocol != PROTOCOL:
        raise RelayRefused(f"not a trainhub session relay: {challenge[:40]!r}")
    try:
        nonce = bytes.fromhex(nonce_hex.decode())
    except ValueError:
        raise RelayRefused("the relay's challenge is malformed") from None
    return _mac(secret, nonce).hex().encode() + b"\n"


def check_verdict(line: bytes) -> None:
    """Raise :class:`RelayRefused` unless the relay's last handshake line says ``ok``."""
    if line.strip() != OK:
        text = line.decode(errors="replace").strip() or "closed the connection"
        raise RelayRefused(f"the session's relay: {text}")


def _mac(secret: str, nonce: bytes) -> bytes:
    return hmac.new(secret.encode(), PROTOCOL + nonce, hashlib.sha256).digest()


def handshake_blocking(sock: socket.socket, secret: str) -> None:
    """The client's side of the handshake on a connected blocking socket."""
    sock.sendall(answer_for(secret, _read_line(sock)))
    check_verdict(_read_line(sock))


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)  # byte by byte: never read past the handshake
        if not byte:
            break
        line += byte
        if len(line) > MAX_LINE:
            raise RelayRefused("the relay's handshake line is too long")
    return line


class RelayServer:
    """Splices authenticated TCP connections to one unix socket, on a thread of its own.

    Args:
        host: the address to listen on (the node's cluster address).
        socket_path: where the session's server listens (it may not exist yet).
        secret: what a client must prove it knows (:func:`new_secret`).
    """

    def __init__(self, host: str, socket_path: str | Callable[[], str], secret: str) -> None:
        self._path = socket_path if callable(socket_path) else (lambda: str(socket_path))
        self.secret = secret
        self._loop = asyncio.new_event_loop()
        self._open = 0
        self.refused = 0  # handshakes that failed (tests read it)
        self.relayed = 0  # connections spliced to the socket
        started = threading.Event()
        failure: list[BaseException] = []
        self._server: asyncio.Server | None = None

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._server = self._loop.run_until_complete(
                    asyncio.start_server(self._serve, host, 0, limit=_CHUNK)
                )
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="session-relay", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        assert self._server is not None
        address = self._server.sockets[0].getsockname()
        self.address: tuple[str, int] = (str(address[0]), int(address[1]))

    def close(self) -> None:
        """Stop listening and end every relayed connection."""
        if self._loop.is_closed():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with contextlib.suppress(RuntimeError):
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._open >= MAX_CONNECTIONS:
                writer.write(b"unavailable: too many connections\n")
                return
            self._open += 1
            try:
                up_reader, upstream = await self._authenticated(reader, writer)
                if up_reader is None or upstream is None:
                    return
                self.relayed += 1
                await _splice(reader, writer, up_reader, upstream)
            finally:
                self._open -= 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            for side in (upstream, writer):
                if side is not None:
                    side.close()
                    with contextlib.suppress(Exception):
                        await side.wait_closed()

    async def _authenticated(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader | None, asyncio.StreamWriter | None]:
        line, nonce = challenge_line()
        writer.write(line)
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.readuntil(b"\n"), HANDSHAKE_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.refused += 1
            return None, None
        expected = _mac(self.secret, nonce).hex().encode()
        if not hmac.compare_digest(answer.strip(), expected):
            self.refused += 1
            writer.write(b"refused\n")
            await writer.drain()
            return None, None
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(
                _reachable(self._path()), limit=_CHUNK
            )
        except OSError as exc:
            writer.write(f"unavailable: the session's server: {exc.strerror or exc}\n".encode())
            await writer.drain()
            return None, None
        writer.write(OK + b"\n")
        await writer.drain()
        return up_reader, up_writer


def _reachable(path: str) -> str:
    """``path``, or the same socket through ``/proc/self/fd`` when ``path`` is too long for
    ``connect`` (a node's work folder can be deep)."""
    if len(path.encode()) < _MAX_UNIX_PATH:
        return path
    folder = str(Path(path).parent)
    with _HELD_LOCK:
        fd = _HELD_FOLDERS.get(folder)
        if fd is None or not _same_folder(fd, folder):
            if fd is not None:
                os.close(fd)
            fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
            _HELD_FOLDERS[folder] = fd
    return f"/proc/self/fd/{fd}/{Path(path).name}"


def _same_folder(fd: int, folder: str) -> bool:
    """Whether ``fd`` still is ``folder`` (a folder removed and made again is another one)."""
    try:
        held, now = os.fstat(fd), os.stat(folder)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


_HELD_FOLDERS: dict[str, int] = {}  # long folders, opened once (O_PATH: holds no data)
_HELD_LOCK = threading.Lock()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways; an end of one direction is passed on as a half-close (HTTP keeps
    working), and the splice ends when both directions ended or either side failed."""

    async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()

    tasks = [
        asyncio.ensure_future(copy(reader, up_writer)),
        asyncio.ensure_future(copy(up_reader, writer)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
