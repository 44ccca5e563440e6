"""The control plane's reverse proxy to session servers (HTTP and WebSocket), and the probe that
asks them how they are used.

A session's server listens on a unix socket in its attempt's spool folder on the node
(runtime/session_server.py); the proxy forwards each request the dashboard's route let through
(web/session_pages.py checks the caller first) to that socket with httpx, and each WebSocket
with ``websockets``, adding the session's secret as jupyter-server's ``Authorization: token``
and dropping trainhub's own credentials (the API token, the dashboard's cookie): the session's
server never sees them.

A session on another node is reached through the relay its rank actor serves there
(adapters/session_relay.py, ADR 0041): the same clients, over a connection that proved it knows
the relay's secret before the relay spliced it to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket as sockets
import tempfile
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpcore
import httpx
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed

from trainhub.adapters.session_relay import (
    MAX_LINE,
    RelayRefused,
    answer_for,
    check_verdict,
    handshake_blocking,
)
from trainhub.service.ports import SessionEndpoint

# headers that belong to one hop (RFC 9110 7.6.1) or that the proxy sets itself
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "authorization",
        "content-length",
    }
)
_OWN_COOKIES = ("trainhub_session", "trainhub_login_csrf")
_MAX_UNIX_PATH = 100  # sun_path holds 108 bytes with its NUL; longer paths go by a link


def upstream_headers(headers: Iterable[tuple[str, str]], secret: str) -> list[tuple[str, str]]:
    """The request's headers as the session's server gets them: its secret instead of the
    caller's credentials, trainhub's cookies removed."""
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP or lower.startswith("sec-websocket"):
            continue
        if lower == "cookie":
            kept = [
                part
                for part in value.split(";")
                if part.strip().split("=", 1)[0] not in _OWN_COOKIES
            ]
            if not kept:
                continue
            out.append((name, ";".join(kept).strip()))
            continue
        out.append((name, value))
    out.append(("Authorization", f"token {secret}"))
    return out


def downstream_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in _HOP or k.lower() == "content-length"]


class _Links:
    """Short paths for sockets whose path is too long for ``connect`` (links in a private
    folder; the kernel follows a link to a socket without the length limit)."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def short(self, path: str) -> str:
        if len(path.encode()) < _MAX_UNIX_PATH:
            return path
        with self._lock:
            if path in self._known:
                return self._known[path]
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="th-s-"))
                os.chmod(self._folder, 0o700)
            link = self._folder / str(len(self._known))
            link.unlink(missing_ok=True)
            link.symlink_to(path)
            self._known[path] = str(link)
            return str(link)


_CONNECT_TIMEOUT_S = 5.0
_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)


async def _read_line_async(stream: httpcore.AsyncNetworkStream, timeout: float | None) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        data = await stream.read(MAX_LINE, timeout=timeout)
        if not data:
            break
        line += data
        if len(line) > MAX_LINE or b"\n" in line[:-1]:  # the relay waits after each line
            raise RelayRefused("the relay's handshake is malformed")
    return line


def _read_line_sync(stream: httpcore.NetworkStream, timeout: float | None) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        data = stream.read(MAX_LINE, timeout=timeout)
        if not data:
            break
        line += data
        if len(line) > MAX_LINE or b"\n" in line[:-1]:
            raise RelayRefused("the relay's handshake is malformed")
    return line


class _RelayBackend(httpcore.AsyncNetworkBackend):
    """httpcore's connections for one endpoint: TCP to its node's relay, then the handshake
    (the host and port of the request's URL are not used: the relay serves one socket)."""

    def __init__(self, endpoint: SessionEndpoint) -> None:
        assert endpoint.relay is not None
        self._endpoint = endpoint
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        relay_host, relay_port = self._endpoint.relay or ("", 0)
        stream = await self._inner.connect_tcp(
            relay_host, relay_port, timeout=timeout, socket_options=socket_options
        )
        try:
            challenge = await _read_line_async(stream, timeout)
            await stream.write(answer_for(self._endpoint.relay_secret, challenge), timeout)
            check_verdict(await _read_line_async(stream, timeout))
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise RelayRefused("a relayed endpoint has no local socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _SyncRelayBackend(httpcore.NetworkBackend):
    """:class:`_RelayBackend` for blocking clients (the idle probe)."""

    def __init__(self, endpoint: SessionEndpoint) -> None:
        self._endpoint = endpoint
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        relay_host, relay_port = self._endpoint.relay or ("", 0)
        stream = self._inner.connect_tcp(
            relay_host, relay_port, timeout=timeout, socket_options=socket_options
        )
        try:
            challenge = _read_line_sync(stream, timeout)
            stream.write(answer_for(self._endpoint.relay_secret, challenge), timeout)
            check_verdict(_read_line_sync(stream, timeout))
        except BaseException:
            stream.close()
            raise
        return stream


def _async_transport(endpoint: SessionEndpoint, links: _Links) -> httpx.AsyncHTTPTransport:
    if endpoint.relay is None:
        return httpx.AsyncHTTPTransport(uds=links.short(endpoint.socket), limits=_LIMITS)
    transport = httpx.AsyncHTTPTransport(limits=_LIMITS)
    # httpx takes no network backend of its own: its pool is httpcore's, given ours
    transport._pool = httpcore.AsyncConnectionPool(
        network_backend=_RelayBackend(endpoint),
        max_connections=_LIMITS.max_connections,
        max_keepalive_connections=_LIMITS.max_keepalive_connections,
        keepalive_expiry=_LIMITS.keepalive_expiry,
    )
    return transport


def sync_transport(endpoint: SessionEndpoint, links: _Links | None = None) -> httpx.HTTPTransport:
    """A blocking httpx transport to a session's server (its socket, or through its relay)."""
    if endpoint.relay is None:
        return httpx.HTTPTransport(uds=(links or _Links()).short(endpoint.socket))
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(network_backend=_SyncRelayBackend(endpoint))
    return transport


def _relayed_socket(endpoint: SessionEndpoint) -> sockets.socket:
    """A connection to the endpoint's relay, past its handshake (blocking; for WebSockets)."""
    assert endpoint.relay is not None
    sock = sockets.create_connection(endpoint.relay, timeout=_CONNECT_TIMEOUT_S)
    try:
        sock.setsockopt(sockets.IPPROTO_TCP, sockets.TCP_NODELAY, 1)
        handshake_blocking(sock, endpoint.relay_secret)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


class SessionRelay:
    """Forwards requests to session servers; one keep-alive client per endpoint (a socket on
    this host, or a node's relay)."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._timeout = httpx.Timeout(timeout_s, connect=_CONNECT_TIMEOUT_S)
        self._links = _Links()

    def _client(self, endpoint: SessionEndpoint) -> httpx.AsyncClient:
        client = self._clients.get(endpoint.key)
        if client is None:
            transport = _async_transport(endpoint, self._links)
            client = httpx.AsyncClient(transport=transport, timeout=self._timeout)
            self._clients[endpoint.key] = client
        return client

    async def forget(self, endpoint: SessionEndpoint) -> None:
        client = self._clients.pop(endpoint.key, None)
        if client is not None:
            await client.aclose()

    async def http(
        self,
        endpoint: SessionEndpoint,
        secret: str,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], AsyncIterator[bytes], Any]:
        """(status, headers, body chunks, close) of the server's answer to one request."""
        client = self._client(endpoint)
        request = client.build_request(
            method,
            f"http://session{target}",
            headers=upstream_headers(headers, secret),
            content=body,
        )
        try:
            response = await client.send(request, stream=True)
        except (httpx.TransportError, OSError):
            await self.forget(endpoint)
            raise
        return (
            response.status_code,
            downstream_headers(response.headers.multi_items()),
            response.aiter_raw(),
            response.aclose,
        )

    async def websocket(
        self,
        endpoint: SessionEndpoint,
        secret: str,
        target: str,
        host: str,
        headers: Iterable[tuple[str, str]],
        subprotocols: list[str],
    ) -> ClientConnection:
        """A WebSocket to the session's server (the caller relays it with :func:`pump`)."""
        options: dict[str, Any] = {
            "additional_headers": [
                (k, v) for k, v in upstream_headers(headers, secret) if k.lower() != "host"
            ],
            "subprotocols": subprotocols or None,
            "max_size": None,
            "open_timeout": 10,
            "compression": None,
        }
        if endpoint.relay is None:
            return await unix_connect(
                self._links.short(endpoint.socket), uri=f"ws://{host}{target}", **options
            )
        sock = await asyncio.get_running_loop().run_in_executor(None, _relayed_socket, endpoint)
        return await connect(f"ws://{host}{target}", sock=sock, **options)

    async def pump(self, receive_client: Any, send_client: Any, upstream: Any) -> None:
        await pump(receive_client, send_client, upstream)


async def pump(receive_client: Any, send_client: Any, upstream: ClientConnection) -> None:
    """Relay messages both ways until either side closes; then close the other."""

    async def to_upstream() -> None:
        while True:
            message = await receive_client()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def to_client() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                if isinstance(data, bytes):
                    await send_client({"type": "websocket.send", "bytes": data})
                else:
                    await send_client({"type": "websocket.send", "text": data})

    tasks = [asyncio.create_task(to_upstream()), asyncio.create_task(to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await upstream.close()
        with contextlib.suppress(Exception):
            await send_client({"type": "websocket.close", "code": 1000})


class JupyterProbe:
    """:class:`~trainhub.service.sessions.SessionProbe` over jupyter-server's ``/api/status``
    (which does not count as activity itself)."""

    def __init__(self, timeout_s: float = 3.0) -> None:
        self.timeout_s = timeout_s
        self._links = _Links()

    def activity(
        self, endpoint: SessionEndpoint, secret: str, base: str
    ) -> tuple[float | None, int] | None:
        transport = sync_transport(endpoint, self._links)
        try:
            with httpx.Client(transport=transport, timeout=self.timeout_s) as client:
                answer = client.get(
                    f"http://session{base}api/status",
                    headers={"Authorization": f"token {secret}"},
                )
        except (httpx.HTTPError, OSError):
            return None
        if answer.status_code != 200:
            return None
        try:
            body: Mapping[str, Any] = answer.json()
            last = body.get("last_activity")
            at = _timestamp(str(last)) if last else None
            return at, int(body.get("connections") or 0)
        except (ValueError, TypeError):
            return None


def _timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
