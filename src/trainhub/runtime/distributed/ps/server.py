"""Parameter shards served over TCP from inside the trial's own ranks.

Shard ``i`` of a trial lives in rank ``i mod world_size``: that rank's runtime starts a
:class:`ShardServer`, an asyncio event loop on a daemon thread of its process, and every rank
reaches it with :class:`~trainhub.runtime.distributed.ps.client.ParameterServerClient`. So the
shards are placed with the trial's gang and use its resources (counted against its tenant),
start and end with it, and need nothing from Ray or any cluster credential: a rank reaches them
exactly as it reaches its peers for gloo. Every connection starts with the trial's shared
secret (32 random bytes rank 0 draws and broadcasts over the process group); a connection
without it is closed before anything is read or sent.

Wire format, both ways: a 4-byte big-endian length, that many bytes of a JSON header, then
``header["nbytes"]`` bytes of float32 payload (gradients out, weights back). No pickle.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import struct
import threading
from typing import Any

import numpy as np

from trainhub.runtime.distributed.ps.shard import Hyper, ParameterShard

SECRET_BYTES = 32
_LENGTH = struct.Struct(">I")


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One message: length-prefixed JSON header, then the raw payload."""
    text = json.dumps({**header, "nbytes": len(payload)}).encode()
    return _LENGTH.pack(len(text)) + text + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    header: dict[str, Any] = json.loads(await reader.readexactly(length))
    payload = await reader.readexactly(int(header["nbytes"]))
    return header, payload


def reachable_host(peer: str) -> str:
    """The address of this machine's interface that routes to ``peer`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class ShardServer:
    """Serves some shards of a trial on ``(host, port)`` from a background event loop.

    Args:
        shards: shard index -> the shard this rank hosts.
        secret: what every connection must send first.
        host: the interface to listen on (one the other ranks reach).
    """

    def __init__(self, shards: dict[int, ParameterShard], secret: bytes, host: str) -> None:
        self.shards = shards
        self._secret = secret
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trainhub-ps-shards", daemon=True
        )
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, host, 0), self._loop
        ).result()
        port = int(self._server.sockets[0].getsockname()[1])
        self.address = (host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            offered = await reader.readexactly(len(self._secret))
            if not hmac.compare_digest(offered, self._secret):
                return
            while True:
                header, payload = await read_message(reader)
                reply, data = await self._handle(header, payload)
                writer.write(encode(reply, data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _handle(self, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        try:
            shard = self.shards[int(header["shard"])]
            op = header["op"]
            if op == "push_pull":
                grad = np.frombuffer(payload, dtype=np.float32)
                weights, version = await shard.push_pull(
                    int(header["worker"]),
                    int(header["clock"]),
                    grad,
                    Hyper(**header["hyper"]),
                    int(header["based_on"]),
                )
            elif op == "pull":
                weights, version = await shard.pull()
            elif op == "trace":
                return {"trace": await shard.trace()}, b""
            else:
                raise ValueError(f"unknown operation {op!r}")
        except Exception as exc:  # sent back: the worker raises it where the user can see it
            return {"error": f"{type(exc).__name__}: {exc}"}, b""
        return {"version": version}, weights.tobytes()

    def close(self) -> None:
        """Stop serving and end the loop's thread."""

        async def stop() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
