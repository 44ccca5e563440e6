"""A test peer for the runtime: the routes of ``trainhub.runtime.protocol`` over real HTTP.

It records what it receives and can be told to fail, so tests can check batching, retries and
idempotency the way the runtime really talks (sockets, status codes), without the control plane
another engineer builds. It stops and starts again on the same port to play an outage.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fixtures.ports import free_port
from trainhub.runtime import protocol

_METRICS = re.compile(r"^/api/v1/trials/(\d+)/metrics$")
_CHECKPOINTS = re.compile(r"^/api/v1/trials/(\d+)/checkpoints$")
_CHECKPOINT_FILE = re.compile(r"^/api/v1/trials/(\d+)/checkpoints/(\d+)/file$")
_MANIFEST = re.compile(r"^/api/v1/trials/(\d+)/checkpoints/(\d+)/manifest$")
_SIGNALS = re.compile(r"^/api/v1/trials/(\d+)/signals$")


@dataclass
class StoredCheckpoint:
    id: int
    uuid: str
    step: int
    attempt: int
    metrics: dict[str, Any]
    data: bytes


@dataclass
class FakeControlPlane:
    """Serves one trial. Set ``signals`` to ask for a stop; queue statuses in ``fail_next``."""

    trial_id: int = 7
    token: str = "trial-token"
    port: int = field(default_factory=free_port)
    metric_batches: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, StoredCheckpoint] = field(default_factory=dict)
    checkpoint_posts: list[str] = field(default_factory=list)  # uuid of every POST, retries too
    signals: dict[str, Any] = field(default_factory=lambda: {"should_stop": False, "reason": None})
    signal_gets: int = 0
    # route kind ("metrics", "checkpoints", "file", "signals") -> statuses to answer next
    fail_next: dict[str, deque[int]] = field(default_factory=dict)
    # register the next N checkpoint uploads, then answer 503 as if the answer got lost
    lose_next_checkpoint_answers: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The variables the executor would set for rank 0 of this trial."""
        return {
            protocol.ENV_API_URL: self.url,
            protocol.ENV_TOKEN: self.token,
            protocol.ENV_TRIAL_ID: str(self.trial_id),
            protocol.ENV_ATTEMPT: "1",
            **extra,
        }

    def start(self) -> FakeControlPlane:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        server.daemon_threads = True
        server.block_on_close = False  # keep-alive connections must not delay stop()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def fail(self, kind: str, *statuses: int) -> None:
        with self.lock:
            self.fail_next.setdefault(kind, deque()).extend(statuses)

    def add_checkpoint(self, data: bytes, step: int = 0) -> int:
        with self.lock:
            checkpoint_id = len(self.checkpoints) + 1
            uuid = f"preloaded-{checkpoint_id}"
            self.checkpoints[uuid] = StoredCheckpoint(checkpoint_id, uuid, step, 1, {}, data)
            return checkpoint_id

    def points(self) -> list[dict[str, Any]]:
        with self.lock:
            return [point for batch in self.metric_batches for point in batch.get("points", [])]

    def values_by_step(self) -> dict[int, dict[str, float]]:
        merged: dict[int, dict[str, float]] = {}
        for point in self.points():
            merged.setdefault(point["step"], {}).update(point["values"])
        return merged


def _handler_for(plane: FakeControlPlane) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))

        def _refuse(self, kind: str) -> bool:
            """Answer 401 to a wrong token or a queued failure; True if it did."""
            if self.headers.get("Authorization") != f"Bearer {plane.token}":
                self._reply(401, {"detail": "bad token"})
                return True
            with plane.lock:
                queued = plane.fail_next.get(kind)
                status = queued.popleft() if queued else None
            if status is not None:
                self._reply(status, {"detail": f"injected {status}"})
                return True
            return False

        def _checkpoint(self, wanted: int) -> list[StoredCheckpoint]:
            """The checkpoint of id ``wanted`` (one or none); a 404 sent where none."""
            with plane.lock:
                found = [c for c in plane.checkpoints.values() if c.id == wanted]
            if not found:
                self._reply(404, {"detail": "no such checkpoint"})
            return found

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if match := _SIGNALS.match(path):
                if self._refuse("signals"):
                    return
                with plane.lock:
                    plane.signal_gets += 1
                    body = dict(plane.signals)
                self._reply(200 if int(match.group(1)) == plane.trial_id else 404, body)
            elif match := _CHECKPOINT_FILE.match(path):
                if self._refuse("file"):
                    return
                found = self._checkpoint(int(match.group(2)))
                if not found:
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(found[0].data)))
                self.end_headers()
                self.wfile.write(found[0].data)
            elif match := _MANIFEST.match(path):
                # every checkpoint here is one file: the answer a restore reads before it
                # downloads (the real route says the same of a one-file checkpoint)
                if self._refuse("file"):
                    return
                found = self._checkpoint(int(match.group(2)))
                if not found:
                    return
                c = found[0]
                record = {"id": c.id, "uuid": c.uuid, "step": c.step, "metrics": c.metrics}
                self._reply(200, {"sharded": False, "checkpoint": record})
            else:
                self._reply(404, {"detail": "no route"})

        def do_POST(self) -> None:
            parsed = urlparse(self.path)
            body = self._body()
            if _METRICS.match(parsed.path):
                if self._refuse("metrics"):
                    return
                with plane.lock:
                    plane.metric_batches.append(json.loads(body))
                    answer = dict(plane.signals)
                self._reply(200, answer)  # the stop rides on the reply, as the real one does
            elif _CHECKPOINTS.match(parsed.path):
                if self._refuse("checkpoints"):
                    return
                query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
                with plane.lock:
                    plane.checkpoint_posts.append(query["uuid"])
                    stored = plane.checkpoints.get(query["uuid"])
                    if stored is None:  # the same uuid again registers nothing new
                        stored = StoredCheckpoint(
                            id=len(plane.checkpoints) + 1,
                            uuid=query["uuid"],
                            step=int(query["step"]),
                            attempt=int(query["attempt"]),
                            metrics=json.loads(query["metrics"]),
                            data=body,
                        )
                        plane.checkpoints[stored.uuid] = stored
                    lose = plane.lose_next_checkpoint_answers > 0
                    if lose:
                        plane.lose_next_checkpoint_answers -= 1
                if lose:
                    self._reply(503, {"detail": "answer lost"})
                    return
                record = {
                    "id": stored.id,
                    "uuid": stored.uuid,
                    "step": stored.step,
                    "metrics": stored.metrics,
                }
                self._reply(201, record)
            else:
                self._reply(404, {"detail": "no route"})

    return Handler
