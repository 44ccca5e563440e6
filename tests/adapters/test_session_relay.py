"""The relay to a session's socket from another host (adapters/session_relay.py, ADR 0041):
only a client that proves it knows the relay's secret gets a byte to the socket; the others
(no handshake, a wrong secret, a replayed handshake, plain HTTP) are refused before the relay
connects to it. A real unix socket server stands for the session's server."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trainhub.adapters.session_proxy import JupyterProbe
from trainhub.adapters.session_relay import (
    RelayRefused,
    RelayServer,
    answer_for,
    handshake_blocking,
    new_secret,
)
from trainhub.service.ports import SessionEndpoint


class EchoServer:
    """A unix socket that upper-cases what it gets and counts its connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)  # a long path: go round
        try:
            self._sock.bind(f"/proc/self/fd/{folder}/{path.name}")
        finally:
            os.close(folder)
        self._sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[tuple[RelayServer, EchoServer]]:
    # a deep folder: the socket's path is longer than connect() takes (the relay goes round)
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    echo = EchoServer(folder / "session.sock")
    relay = RelayServer("127.0.0.1", str(echo.path), new_secret())
    try:
        yield relay, echo
    finally:
        relay.close()
        echo.close()


def _connect(relay: RelayServer) -> socket.socket:
    sock = socket.create_connection(relay.address, timeout=10)
    return sock


def test_a_client_with_the_secret_is_spliced_to_the_socket(
    relayed: tuple[RelayServer, EchoServer],
) -> None:
    relay, echo = relayed
    with _connect(relay) as sock:
        handshake_blocking(sock, relay.secret)
        sock.sendall(b"hello")
        assert sock.recv(100) == b"HELLO"
        sock.sendall(b"x" * 200_000)  # more than one chunk each way
        got = b""
        while len(got) < 200_000:
            got += sock.recv(65536)
        assert got == b"X" * 200_000
        sock.shutdown(socket.SHUT_WR)  # a half-close reaches the server, which ends
        assert sock.recv(100) == b""
    assert echo.accepted == 1
    assert relay.refused == 0


def test_a_wrong_secret_a_replay_and_plain_http_never_reach_the_socket(
    relayed: tuple[RelayServer, EchoServer],
) -> None:
    relay, echo = relayed
    # someone who does not know the secret
    with _connect(relay) as sock, pytest.raises(RelayRefused, match="refused"):
        handshake_blocking(sock, new_secret())
    with _connect(relay) as sock:  # an answer recorded from another connection
        first = sock.recv(200)
        answer = answer_for(relay.secret, first)
    with _connect(relay) as sock:
        sock.recv(200)  # this connection's own nonce
        sock.sendall(answer)
        assert sock.recv(100) == b"refused\n"
    with _connect(relay) as sock:  # a browser or curl pointed at the port
        sock.recv(200)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100) == b"refused\n"
    assert echo.accepted == 0
    assert relay.refused == 4  # the recording connection hung up unanswered: refused too


def test_a_server_not_there_yet_is_said_after_the_handshake(tmp_path: Path) -> None:
    relay = RelayServer("127.0.0.1", str(tmp_path / "session.sock"), new_secret())
    try:
        with _connect(relay) as sock, pytest.raises(RelayRefused, match="unavailable"):
            handshake_blocking(sock, relay.secret)
    finally:
        relay.close()


def test_the_probe_and_http_clients_go_through_the_relay(tmp_path: Path) -> None:
    """The control plane's httpx clients (the proxy's and the idle probe's) over a relay to a
    real HTTP server on a unix socket; with a wrong secret they fail as unreachable."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"last_activity": "2026-11-27T12:00:00Z", "connections": 2}'
            ok = self.headers.get("Authorization") == "token s3cret"
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class UnixHTTPServer(ThreadingHTTPServer):
        address_family = socket.AF_UNIX

        def server_bind(self) -> None:
            self.socket.bind(self.server_address)

        def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
            conn, _ = self.socket.accept()
            return conn, ("relay", 0)

    path = tmp_path / "session.sock"
    server = UnixHTTPServer(str(path), Handler)  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    relay = RelayServer("127.0.0.1", str(path), new_secret())
    try:
        endpoint = SessionEndpoint(str(path), relay.address, relay.secret)
        answer = JupyterProbe().activity(endpoint, "s3cret", "/")
        assert answer is not None
        assert answer[1] == 2
        wrong = SessionEndpoint(str(path), relay.address, new_secret())
        assert JupyterProbe().activity(wrong, "s3cret", "/") is None
        assert relay.refused == 1

        import asyncio

        from trainhub.adapters.session_proxy import SessionRelay

        async def through_proxy() -> tuple[int, bytes]:
            proxy = SessionRelay()
            status, _, chunks, close = await proxy.http(endpoint, "s3cret", "GET", "/x", [], b"")
            body = b"".join([c async for c in chunks])
            await close()
            with pytest.raises((httpx.TransportError, OSError)):
                await proxy.http(wrong, "s3cret", "GET", "/x", [], b"")
            return status, body

        status, body = asyncio.run(through_proxy())
        assert status == 200
        assert b'"connections": 2' in body
    finally:
        relay.close()
        server.shutdown()
