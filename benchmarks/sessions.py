"""From `trainhub notebook` to a JupyterLab page that answers through the proxy, and what the
proxy costs a request.

Through a real control plane (its own process, ``tick_interval_s`` at the production default
of 1 s, the sandbox as ``--sandbox`` says) on a real Ray head: each session is started with
``POST /api/v1/sessions`` (what the CLI and the dashboard send) and timed until ``GET`` of its
``/lab`` page through the proxy answers 200 (polled every 50 ms). A warm-up session before the
measured ones is not counted (page cache, Ray's first worker process: the "warm node" of the
issue). Every session is stopped before the next one starts.

The proxy's overhead is measured on the last session while it runs: the same small request
(``api/status``) alternately through the control plane's proxy and straight to the session's
unix socket (both with a keep-alive httpx client), ``--requests`` of each; the line reports the
difference of the medians. ``relay_overhead_ms``: what the relay to a session on another node
adds (ADR 0041): the same request through the node-side relay (its code in a process of its
own, as in the rank actor; the proxy's own relayed client) minus straight to the socket.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/sessions.py [--sessions 10] [--requests 200]

``--without-ray`` (where no Ray head can start, e.g. a machine too loaded for its 30 s start):
the control plane is the web tests' in-process app under uvicorn (tests/web/
test_session_proxy.py's rig) and the benchmark starts each session's server itself, as its
rank would, once the session is submitted: ``ready_s_*`` then leave out the scheduler's tick
and Ray's placement (the line says ``"scheduler": false``); the proxy's overhead is measured
the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.control_plane import ControlPlaneProcess  # noqa: E402

from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray  # noqa: E402
from trainhub.adapters.ray_executor.rank_worker import node_work_root  # noqa: E402


def _start_and_wait(plane: ControlPlaneProcess, client: httpx.Client) -> tuple[float, dict]:
    started = time.perf_counter()
    r = client.post("/api/v1/sessions", json={"kind": "notebook", "idle_timeout_s": 600})
    r.raise_for_status()
    session = r.json()
    while True:
        state = client.get(f"/api/v1/sessions/{session['id']}").json()
        if state["state"] in ("FAILED", "CANCELED"):
            raise RuntimeError(f"session ended: {state}\n{plane.log_tail()}")
        if state["state"] == "RUNNING" and client.get(session["url"]).status_code == 200:
            return time.perf_counter() - started, state
        time.sleep(0.05)


def _stop(client: httpx.Client, session: dict) -> None:
    client.post(f"/api/v1/sessions/{session['id']}/stop").raise_for_status()
    while client.get(f"/api/v1/sessions/{session['id']}").json()["state"] not in (
        "CANCELED",
        "FAILED",
    ):
        time.sleep(0.1)


def _overhead_ms(
    plane: ControlPlaneProcess, session: dict, token: str, requests: int, ray_dir: Path
) -> tuple[float, float]:
    """(the proxy's cost per request over a direct one to the socket, the relay's cost per
    request over the same direct one); the relay is the node-side code of ADR 0041 in a
    process of its own (as in the rank actor), reached by the proxy's own client."""
    from trainhub.adapters.session_proxy import sync_transport
    from trainhub.service.ports import SessionEndpoint

    base = session["url"].removesuffix("lab")
    key = f"t{session['trial_id']}-a1"
    roots = [ray_dir / "work", node_work_root(None)]  # the head's TRAINHUB_NODE_WORK_DIR, or tmp
    sockets = [p for r in roots for p in r.glob(f"*/{key}/spool/session.sock")]
    if not sockets:
        raise RuntimeError(f"no socket of {key} under {node_work_root(None)}")
    relay_secret = "r" * 64
    relay = subprocess.Popen(
        [sys.executable, "-c", _RELAY, str(sockets[0]), relay_secret],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert relay.stdout is not None
    port = int(relay.stdout.readline())
    endpoint = SessionEndpoint(str(sockets[0]), ("127.0.0.1", port), relay_secret)
    try:
        with (
            httpx.Client(
                base_url=plane.url, headers={"Authorization": f"Bearer {token}"}
            ) as proxied,
            httpx.Client(transport=httpx.HTTPTransport(uds=str(sockets[0]))) as direct,
            httpx.Client(transport=sync_transport(endpoint)) as relayed,
        ):
            secret = _secret(plane, int(session["id"]))
            direct_headers = {"Authorization": f"token {secret}"}
            through, straight, via_relay = [], [], []
            for _ in range(requests):
                t = time.perf_counter()
                assert proxied.get(f"{base}api/status").status_code == 200
                through.append(time.perf_counter() - t)
                t = time.perf_counter()
                answer = direct.get(f"http://s{base}api/status", headers=direct_headers)
                assert answer.status_code == 200
                straight.append(time.perf_counter() - t)
                t = time.perf_counter()
                answer = relayed.get(f"http://s{base}api/status", headers=direct_headers)
                assert answer.status_code == 200
                via_relay.append(time.perf_counter() - t)
    finally:
        relay.terminate()
        relay.wait(10)
    direct_ms = statistics.median(straight) * 1000
    return (
        statistics.median(through) * 1000 - direct_ms,
        statistics.median(via_relay) * 1000 - direct_ms,
    )


_RELAY = """
import sys, time
from trainhub.adapters.session_relay import RelayServer
relay = RelayServer("127.0.0.1", sys.argv[1], sys.argv[2])
print(relay.address[1], flush=True)
time.sleep(3600)
"""


def _secret(plane: ControlPlaneProcess, session_id: int) -> str:
    import hashlib
    import hmac

    key = (plane.home / "session-key").read_bytes()
    return hmac.new(key, f"session-{session_id}".encode(), hashlib.sha256).hexdigest()


def _without_ray(sessions: int, requests: int) -> dict[str, object]:
    from tests.web.test_session_proxy import open_rig

    scratch = Path(tempfile.mkdtemp(prefix="th-bench-sessions-"))
    try:
        with open_rig(scratch) as rig:
            return _measure_rig(rig, sessions, requests)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _measure_rig(rig: Any, sessions: int, requests: int) -> dict[str, object]:
    ready = []
    last: dict = {}
    for _ in range(sessions + 1):
        started = time.perf_counter()
        last = rig.start()
        ready.append(time.perf_counter() - started)
    ready = ready[1:]  # the first warms the page cache
    base = last["url"].removesuffix("lab")
    socket = rig.root / "spool" / f"t{last['trial_id']}-a1" / "session.sock"
    secret = rig.service.secret(int(last["id"]))
    # the requests are timed from a process of their own: a client in the server's process
    # shares its interpreter (a bare FastAPI route answers in ~45 ms that way, 0.5 ms from
    # another process on this machine)
    relay_secret = "r" * 64  # the node-side relay of ADR 0041, in a process of its own
    relay = subprocess.Popen(
        [sys.executable, "-c", _RELAY, str(socket), relay_secret], stdout=subprocess.PIPE, text=True
    )
    assert relay.stdout is not None
    port = relay.stdout.readline().strip()
    args = [rig.url, rig.alice, base, str(socket), secret, str(requests), port, relay_secret]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMING_CLIENT, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    finally:
        relay.terminate()
        relay.wait(10)
    times = json.loads(done.stdout)
    through, straight, own = times["proxied"], times["direct"], times["own"]
    overhead = (statistics.median(through) - statistics.median(straight)) * 1000
    floor = (statistics.median(own) - statistics.median(straight)) * 1000
    relay_ms = (statistics.median(times["relayed"]) - statistics.median(straight)) * 1000
    return _line(ready, overhead, requests) | {
        "relay_overhead_ms": round(relay_ms, 3),
        "scheduler": False,
        # what any authenticated request of this control plane costs over the direct one
        "api_request_over_direct_ms": round(floor, 3),
        "proxy_over_api_request_ms": round(overhead - floor, 3),
    }


_TIMING_CLIENT = """
import json, sys, time, httpx
from trainhub.adapters.session_proxy import sync_transport
from trainhub.service.ports import SessionEndpoint
url, token, base, socket, secret, n, port, relay_secret = sys.argv[1:9]
out = {"proxied": [], "direct": [], "own": [], "relayed": []}
auth = {"Authorization": "Bearer " + token}
endpoint = SessionEndpoint(socket, ("127.0.0.1", int(port)), relay_secret)
with httpx.Client(base_url=url, headers=auth) as proxied, httpx.Client(
    transport=httpx.HTTPTransport(uds=socket)
) as direct, httpx.Client(transport=sync_transport(endpoint)) as relayed:
    for _ in range(int(n)):
        t = time.perf_counter()
        assert proxied.get(base + "api/status").status_code == 200
        out["proxied"].append(time.perf_counter() - t)
        t = time.perf_counter()
        assert proxied.get("/api/v1/me").status_code == 200
        out["own"].append(time.perf_counter() - t)
        t = time.perf_counter()
        key = {"Authorization": "token " + secret}
        answer = direct.get("http://s" + base + "api/status", headers=key)
        assert answer.status_code == 200
        out["direct"].append(time.perf_counter() - t)
        t = time.perf_counter()
        answer = relayed.get("http://s" + base + "api/status", headers=key)
        assert answer.status_code == 200
        out["relayed"].append(time.perf_counter() - t)
print(json.dumps(out))
"""


def _line(ready: list[float], overhead_ms: float, requests: int) -> dict[str, object]:
    ready = sorted(ready)
    p95 = ready[min(len(ready) - 1, round(0.95 * (len(ready) - 1)))]
    return {
        "benchmark": "session_start",
        "ready_s_p50": round(statistics.median(ready), 3),
        "ready_s_p95": round(p95, 3),
        "proxy_overhead_ms": round(overhead_ms, 3),
        "sessions": len(ready),
        "requests": requests,
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "none"])
    parser.add_argument("--without-ray", action="store_true")
    args = parser.parse_args()
    if args.without_ray:
        print(json.dumps(_without_ray(args.sessions, args.requests)), flush=True)
        return
    scratch = Path(tempfile.mkdtemp(prefix="th-bench-sessions-"))
    ray_dir = scratch / "ray"
    address = ensure_local_ray(ray_dir, num_cpus=4)
    home = scratch / "home"
    home.mkdir()
    plane = ControlPlaneProcess(
        home, address, settings={"tick_interval_s": 1.0, "sandbox": args.sandbox}
    )
    try:
        plane.start()
        headers = {"Authorization": f"Bearer {plane.token}"}
        with httpx.Client(base_url=plane.url, headers=headers, timeout=60) as client:
            _, warm = _start_and_wait(plane, client)  # the warm-up, not counted
            _stop(client, warm)
            ready = []
            last: dict = {}
            for index in range(args.sessions):
                took, last = _start_and_wait(plane, client)
                ready.append(took)
                if index < args.sessions - 1:
                    _stop(client, last)
            overhead, relay_ms = _overhead_ms(plane, last, plane.token, args.requests, ray_dir)
            _stop(client, last)
        line = _line(ready, overhead, args.requests) | {
            "relay_overhead_ms": round(relay_ms, 3),
            "sandbox": args.sandbox,
            "scheduler": True,
        }
        print(json.dumps(line), flush=True)
    finally:
        plane.stop()
        stop_local_ray(ray_dir)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
