"""``python -m trainhub.runtime.federated ENTRYPOINT...``: every rank of a federated trial.

Rank 0 serves the federation (server.py). Rank K >= 1 supervises client K-1: it runs the
user's client command with this client's environment, passes its output through, and
restarts it when it dies after it joined the federation (a round it was in completes with the
others while ``min_available_clients`` hold; it rejoins in a later round), unless the
federation's server no longer listens: the federation ended while the client was down (or its
server died, which the trial's attempt answers), and the rank ends. A client that dies
before it ever served a round (its code crashes on import, say) fails the rank with exit code
79 and its last output line: the job fails once, not over and over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from trainhub.runtime import protocol
from trainhub.runtime.federated import (
    CLIENT_ENV,
    FEDERATED_ENV,
    JOINED_ENV,
    SERVER_ENV,
)

EXIT_CLIENT_NEVER_JOINED = 79  # trainhub.core.verdicts (tests/runtime keep them equal)
MAX_CLIENT_RESTARTS = 20
_RESTART_PAUSE_S = 0.5
# what a client must not hold: the trial's token (it reports through the server)
_PRIVATE = (protocol.ENV_API_URL, protocol.ENV_TOKEN, "TRAINHUB_RENDEZVOUS_SECRET")


def _say(text: str) -> None:
    sys.stdout.write(f"[trainhub] {text}\n")
    sys.stdout.flush()


def server_address() -> str:
    """host:port of the federation's server: rank 0's rendezvous address, which the executor
    picks per trial (a free port; inside the trial's own network namespace where it has one)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "8080")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def server_listens(tries: int = 3, pause_s: float = 1.0) -> bool:
    """Whether the federation's server accepts connections (``tries`` attempts)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "8080"))
    for attempt in range(tries):
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return True
        except OSError:
            if attempt + 1 < tries:
                time.sleep(pause_s)
    return False


def supervise(argv: list[str], client: int, federated: dict[str, object]) -> int:
    """Run client ``client``'s command until it ends well, restarting it as needed."""
    # the "joined" mark lives for the supervisor only (removed on return and on a signal)
    with tempfile.TemporaryDirectory(prefix=f"federated-client{client}-") as state:
        return _supervise(argv, client, Path(state) / "joined")


def _supervise(argv: list[str], client: int, joined: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE}
    env.update(
        {
            CLIENT_ENV: str(client),
            SERVER_ENV: server_address(),
            JOINED_ENV: str(joined),
            "WORLD_SIZE": "1",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    )
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    restarts = 0
    while True:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        last = ""
        assert child.stdout is not None
        for line in iter(child.stdout.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            text = line.decode(errors="replace").strip()
            if text:
                last = text
        code = child.wait()
        if code == 0:
            return 0
        if not joined.exists():
            _say(
                f"client {client} failed before it joined the federation (exit code {code}): "
                f"{last or 'no output'}"
            )
            return EXIT_CLIENT_NEVER_JOINED
        if not server_listens():
            _say(
                f"client {client} exited with code {code} and the federation's server no "
                "longer listens: the federation is over for this client"
            )
            return 0
        restarts += 1
        if restarts > MAX_CLIENT_RESTARTS:
            _say(f"client {client} failed {restarts} times; giving up (exit code {code})")
            return code if code > 0 else 1
        _say(f"client {client} exited with code {code} mid-federation; restarting it to rejoin")
        time.sleep(_RESTART_PAUSE_S)


def main(argv: list[str]) -> int:
    federated = json.loads(os.environ.get(FEDERATED_ENV) or "{}")
    if not federated:
        _say(f"{FEDERATED_ENV} is not set: run this as a trial of kind federated")
        return 2
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        from trainhub.runtime.federated.server import run

        return run(federated, server_address())
    if not argv:
        _say("no client command: the spec's entrypoint runs each client")
        return 2
    return supervise(argv, rank - 1, federated)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
