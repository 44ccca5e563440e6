"""Hostile and careless input against the control plane's API (issue 14), measured.

Every attack of the issue's "What was seen", sent by a member (or without a token, or with a
wrong one) to the API served in its own process (benchmarks/api_server.py). One JSON line per
attack: ``{"benchmark": "abuse", "attack", "status", "server_rss_growth_mb", "seconds"}``
(targets: a 4xx, < 50 MB of server memory growth, answered in < 1 s; the bodies are built
before the clock starts). Then a viewer's ``GET /experiments`` latency, quiet and while one
member (one process) floods the server with bounded attacks, in alternating windows of the
same run: ``{"benchmark": "abuse_latency", "p95_ms", "quiet_p95_ms", "ratio", ...}``
(target: ratio < 2).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/abuse.py [--latency-requests 300]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import select
import socket
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "src"))

from api_server import ApiServer, start_attempt  # noqa: E402  (needs sys.path)

BASE = "name: demo\nentrypoint: python train.py\n"
MIB = 1024 * 1024


def context(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


CONTEXT = context({"train.py": b"print('hi')\n"})


def alias_bomb(levels: int) -> str:
    lines = [BASE, "hyperparameters:\n", "  a0: &a0 [x,x,x,x,x,x,x,x,x]\n"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n")
    return "".join(lines)


class PeakRss:
    """Samples the server's RSS every 5 ms from a thread; ``stop()`` returns the peak."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.peak = server.rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss_mb())
            time.sleep(0.005)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.server.rss_mb())


def raw_upload(server: ApiServer, path: str, size: int, headers: dict[str, str]) -> int:
    """POST ``size`` bytes the way a client streams them, stopping when the answer comes."""
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {size}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    chunk = b"\0" * MIB
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head.encode())
        sent = 0
        answer = b""
        while True:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            if sent >= size:
                select.select([sock], [], [], 60)
                break
            try:
                sock.sendall(chunk[: min(len(chunk), size - sent)])
            except OSError:
                break  # the server closed: its answer is waiting
            sent += min(len(chunk), size - sent)
        while b"\r\n" not in answer:
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    return int(answer.split(b" ", 2)[1]) if answer else 0


class Bench:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.admin = {"Authorization": f"Bearer {server.token}"}
        self.http = httpx.Client(base_url=server.url + "/api/v1", timeout=120)

    def user(self, username: str, tenant: str, role: str = "member") -> dict[str, str]:
        if tenant not in [t["name"] for t in self.get("/tenants", self.admin)["data"]]:
            self.http.post("/tenants", json={"name": tenant}, headers=self.admin)
        self.http.post("/users", json={"username": username}, headers=self.admin)
        self.http.put(
            f"/users/{username}/memberships",
            json={"tenant": tenant, "role": role},
            headers=self.admin,
        )
        r = self.http.post("/tokens", json={"username": username}, headers=self.admin)
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def get(self, path: str, headers: dict[str, str]) -> Any:
        return self.http.get(path, headers=headers).json()

    def submit(self, headers: dict[str, str], spec: str = BASE, ctx: bytes = CONTEXT) -> int:
        files = {"context": ("context.tar.gz", ctx, "application/gzip")}
        r = self.http.post("/experiments", data={"spec": spec}, files=files, headers=headers)
        return r.status_code

    def running_trial(self, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        """A trial of ``headers``' user with a started attempt and its token (as the control
        loop would make them; written straight to the server's database)."""
        files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
        r = self.http.post("/experiments", data={"spec": BASE}, files=files, headers=headers)
        trial_id = int(r.json()["trials"][0]["id"])
        secret = start_attempt(self.server.db_url, trial_id)
        return trial_id, {"Authorization": f"Bearer {secret}"}

    def end(self, trial_id: int) -> None:
        from trainhub.adapters.db import SqlUnitOfWork, make_engine
        from trainhub.core.states import TrialState
        from trainhub.service.records import TrialUpdate
        from trainhub.service.trial_writes import write_trial

        engine = make_engine(self.server.db_url)
        with SqlUnitOfWork(engine)() as repo:
            update = TrialUpdate(state=TrialState.COMPLETED, ended_at=time.time())
            write_trial(repo, trial_id, update)
        engine.dispose()


def attacks(b: Bench) -> list[tuple[str, Callable[[], int]]]:
    member = b.user("mallory", "vision")
    other = b.user("eve", "vision")
    trial_id, own = b.running_trial(member)
    ended_id, ended_token = b.running_trial(member)
    b.end(ended_id)
    b.http.patch("/tenants/vision", json={"max_checkpoint_bytes": 100 * MIB}, headers=b.admin)
    metrics = f"/trials/{trial_id}/metrics"
    upload = f"/api/v1/trials/{trial_id}/checkpoints?uuid=big&step=999"

    def post_metrics(body: str, headers: dict[str, str] = own, path: str = metrics) -> int:
        r = b.http.post(path, content=body, headers={**headers, "Content-Type": "application/json"})
        return r.status_code

    def point(values: dict[str, Any], points: int = 1) -> str:
        return json.dumps({"points": [{"step": s, "values": values} for s in range(points)]})

    def bad_auth_flood() -> int:
        status = 0
        wrong = {"Authorization": "Bearer th_guessing"}
        for _ in range(25):
            status = b.http.get("/me", headers=wrong).status_code
        return status

    half = CONTEXT[: len(CONTEXT) // 2]
    specs = {
        "spec_depth_1000": BASE + "x: " + "[" * 1000 + "]" * 1000,
        "spec_depth_100000": BASE + "x: " + "[" * 10**5 + "]" * 10**5,
        "int_5000_digits": BASE + "hyperparameters: {x: " + "9" * 5000 + "}",
        "entrypoint_nul": 'name: d\nentrypoint: "python train.py\\0"\n',
        "env_name_with_equals": BASE + 'environment: {variables: {"A=B": "1"}}\n',
        "memory_gb_inf": BASE + "resources: {memory_gb_per_worker: .inf}\n",
        "memory_gb_1e300": BASE + "resources: {memory_gb_per_worker: 1e300}\n",
        "cpus_1e-300": BASE + "resources: {cpus_per_worker: 1e-300}\n",
        "workers_4096": BASE + "resources: {workers: 4096}\n",
    }
    bodies = {
        "json_depth_100000": '{"points": [' + "[" * 100_000 + "]" * 100_000 + "]}",
        "step_beyond_64_bits": point({"a": 1.0}).replace('"step": 0', f'"step": {2**64}'),
        "metric_value_nan": '{"points": [{"step": 1, "values": {"a": NaN}}]}',
        "metric_value_string": '{"points": [{"step": 1, "values": {"a": "0.7"}}]}',
        "metric_value_true": '{"points": [{"step": 1, "values": {"a": true}}]}',
        "attempt_99": '{"attempt": 99, "points": [{"step": 1, "values": {"a": 1}}]}',
    }
    gets = {
        "trial_id_beyond_64_bits": f"/trials/{2**64}",
        "offset_beyond_64_bits": f"/trials/{trial_id}/logs?offset={2**64}",
    }
    one = point({"a": 1.0})
    # built before the clock starts: only the server's part is timed
    long_name = point({"x" * 10_000_000: 1.0})
    many_names = point({f"m{i}": 1.0 for i in range(100_000)})
    many_points = point({"a": 1.0}, 100_000)
    ended = f"/trials/{ended_id}/metrics"
    return [
        ("yaml_alias_bomb_448_bytes", lambda: b.submit(member, alias_bomb(7))),
        ("yaml_alias_bomb_one_level_more", lambda: b.submit(member, alias_bomb(8))),
        ("checkpoint_300mib_member_token", lambda: raw_upload(b.server, upload, 300 * MIB, other)),
        ("checkpoint_300mib_over_quota", lambda: raw_upload(b.server, upload, 300 * MIB, own)),
        ("checkpoint_300mib_unauthenticated", lambda: raw_upload(b.server, upload, 300 * MIB, {})),
        ("metric_name_10mb", lambda: post_metrics(long_name)),
        ("metric_100k_names_in_one_point", lambda: post_metrics(many_names)),
        ("metric_100k_points_in_one_request", lambda: post_metrics(many_points)),
        *[(name, lambda spec=spec: b.submit(member, spec)) for name, spec in specs.items()],
        ("truncated_tar_gz", lambda: b.submit(member, BASE, half)),
        ("not_a_tar", lambda: b.submit(member, BASE, gzip.compress(b"x" * 1000))),
        *[(name, lambda body=body: post_metrics(body)) for name, body in bodies.items()],
        *[
            (name, lambda path=path: b.http.get(path, headers=member).status_code)
            for name, path in gets.items()
        ],
        ("metrics_into_ended_trial", lambda: post_metrics(one, ended_token, ended)),
        ("metrics_by_another_member", lambda: post_metrics(one, other)),
        ("failed_auth_flood_25", bad_auth_flood),
    ]


def flood(
    url: str, headers: dict[str, str], bodies: list[str], go: Any, stop: Any, sent: Any
) -> None:
    """One member's flood of bounded attacks, in its own process (its own GIL and CPU),
    while ``go`` is set."""
    metrics = json.dumps({"points": [{"step": 1, "values": {"a": 1.0}}] * 1001})
    with httpx.Client(base_url=url + "/api/v1", headers=headers) as c:
        i = 0
        while not stop.is_set():
            if not go.wait(0.1):
                continue
            c.post("/experiments", data={"spec": bodies[i % len(bodies)]})
            c.post(
                "/trials/1/metrics", content=metrics, headers={"Content-Type": "application/json"}
            )
            with sent.get_lock():
                sent.value += 2
            i += 1


def latency(b: Bench, requests: int, flooders: int, rounds: int = 6) -> dict[str, Any]:
    """Quiet and flooded windows alternate (``rounds`` of each), so that a change in the
    machine's load during the run falls on both alike."""
    import multiprocessing

    viewer = b.user("victor", "vision", "viewer")
    member = b.user("flooder", "vision")
    bodies = [alias_bomb(8), BASE + "resources: {workers: 4096}\n", BASE + "x: " + "[" * 2000]
    client = httpx.Client(base_url=b.server.url + "/api/v1", headers=viewer)

    def sample(n: int) -> list[float]:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            assert client.get("/experiments").status_code == 200
            times.append((time.perf_counter() - started) * 1000)
        return times

    def p95(times: list[float]) -> float:
        return statistics.quantiles(times, n=20)[18]

    sample(20)  # warm
    context = multiprocessing.get_context("spawn")
    go, stop = context.Event(), context.Event()
    sent = context.Value("i", 0)
    procs = [
        context.Process(target=flood, args=(b.server.url, member, bodies, go, stop, sent))
        for _ in range(flooders)
    ]
    for proc in procs:
        proc.start()
    quiet: list[float] = []
    loaded: list[float] = []
    flood_requests = 0
    per_round = max(20, requests // rounds)
    for _ in range(rounds):
        quiet += sample(per_round)
        go.set()
        before = sent.value
        while sent.value < before + 4:  # the flood is on
            time.sleep(0.01)
        before = sent.value
        loaded += sample(per_round)
        flood_requests += sent.value - before
        go.clear()
        time.sleep(0.2)  # the flood's last requests finish
    stop.set()
    for proc in procs:
        proc.join(30)
    client.close()
    return {
        "benchmark": "abuse_latency",
        "p95_ms": round(p95(loaded), 2),
        "quiet_p95_ms": round(p95(quiet), 2),
        "ratio": round(p95(loaded) / p95(quiet), 2),
        "requests": len(loaded),
        "flood_requests_meanwhile": flood_requests,
        "flooders": flooders,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-requests", type=int, default=300)
    parser.add_argument("--flooders", type=int, default=1, help="Processes flooding at once.")
    parser.add_argument("--only-latency", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainhub-abuse-") as tmp, ApiServer(Path(tmp)) as s:
        bench = Bench(s)
        for name, attack in [] if args.only_latency else attacks(bench):
            before = s.rss_mb()
            peak = PeakRss(s)
            started = time.monotonic()
            status = attack()
            seconds = time.monotonic() - started
            top = peak.stop()
            line = {
                "benchmark": "abuse",
                "attack": name,
                "status": status,
                "server_rss_growth_mb": round(max(0.0, top - before), 1),
                "seconds": round(seconds, 3),
            }
            print(json.dumps(line), flush=True)
        if not args.only_latency:
            # the failed-authentication flood left this address limited: wait it out
            time.sleep(s_window_s() + 1)
        print(json.dumps(latency(bench, args.latency_requests, args.flooders)), flush=True)


def s_window_s() -> float:
    from trainhub.core.limits import FAILED_AUTH_WINDOW_S

    return FAILED_AUTH_WINDOW_S


if __name__ == "__main__":
    main()
