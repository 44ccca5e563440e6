"""`make demo`: start trainhub, run the MNIST example on 2 data-parallel workers, stop.

Starts the control plane with the embedded defaults (SQLite, a local Ray head, a local artifact
directory) in a fresh home under .trainhub/demo, submits examples/mnist with `trainhub submit
--follow` (live progress and metrics), prints the final metrics and where to look next, stops
the server and the Ray head it started, and exits 0 only if the trial completed with validation
accuracy >= 0.95.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / ".trainhub" / "demo"
TARGET_ACCURACY = 0.95
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def wait_healthy(
    url: str, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 120
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the control plane exited early:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit(f"the control plane did not start in {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def main() -> int:
    from trainhub.adapters.ray_executor import stop_local_ray

    if HOME.exists():
        stop_local_ray(HOME / "ray")
        shutil.rmtree(HOME)
    HOME.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = HOME / "server.log"
    say(f"starting the control plane on {url} (SQLite, local Ray, artifacts in {HOME})")
    started = time.monotonic()
    server = subprocess.Popen(
        [str(BIN / "trainhub"), "server", "--home", str(HOME), "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_healthy(url, server, log)
        print(f"ready in {time.monotonic() - started:.1f} s; server log: {log}")
        token = (HOME / "admin-token").read_text().strip()
        print(
            f"dashboard: {url}/ui (log in with the admin token in {HOME / 'admin-token'}); "
            "the demo trial shows up there live while it runs"
        )
        env = dict(os.environ, TRAINHUB_URL=url, TRAINHUB_TOKEN=token)
        say("submitting examples/mnist (LeNet-5 on digits, 2 workers, gloo)")
        spec = REPO / "examples" / "mnist" / "experiment.yaml"
        follow = subprocess.run(
            [str(BIN / "trainhub"), "submit", str(spec), "--follow"], env=env, check=False
        )
        headers = {"Authorization": f"Bearer {token}"}
        experiments = httpx.get(f"{url}/api/v1/experiments", headers=headers, timeout=30).json()
        experiment = experiments["data"][0]
        trial_id = experiment["trial_ids"][0]
        trial = httpx.get(f"{url}/api/v1/trials/{trial_id}", headers=headers, timeout=30).json()
        metrics = trial["latest_metrics"]
        accuracy = float(metrics.get("val_accuracy", 0.0))
        say(f"trial {trial_id}: {trial['state']}")
        for name in sorted(metrics):
            print(f"  {name:<28} {metrics[name]}")
        ok = (
            follow.returncode == 0 and trial["state"] == "COMPLETED" and accuracy >= TARGET_ACCURACY
        )
        verdict = "meets" if accuracy >= TARGET_ACCURACY else "misses"
        print(f"\nvalidation accuracy {accuracy:.4f} {verdict} the target {TARGET_ACCURACY}")
        say("where to look next")
        print(
            f"  dashboard:          {url}/ui/trials/{trial_id} (while a server runs)\n"
            f"  API and its docs:   {url}/api/v1/docs (OpenAPI: {url}/api/v1/openapi.json)\n"
            f"  run it yourself:    trainhub server   (prints the admin token on first start)\n"
            f"  then, with TRAINHUB_URL and TRAINHUB_TOKEN set (or `trainhub login`):\n"
            f"    trainhub ls                       experiments\n"
            f"    trainhub show {experiment['id']:<20}experiment, trial, attempts, checkpoints\n"
            f"    trainhub logs {trial_id} --rank 1 -f        follow a rank's output\n"
            f"    trainhub submit examples/mnist/experiment.yaml --follow"
        )
        return 0 if ok else 1
    finally:
        say("stopping the control plane and the local Ray head it started (trainhub server stop)")
        subprocess.run(
            [str(BIN / "trainhub"), "server", "stop", "--home", str(HOME)], check=False, timeout=120
        )
        if server.poll() is None:  # not yet written its pid file, or stuck
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
        stop_local_ray(HOME / "ray")


if __name__ == "__main__":
    sys.exit(main())
