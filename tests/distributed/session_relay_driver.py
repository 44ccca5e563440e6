"""The control-plane host's part of tests/distributed/test_session_on_another_node.py.

Run on the control-plane host of :func:`tests.distributed.private_nodes.private_cluster` (its
Ray head has no CPU: every session and trial runs on the worker node, whose folders this host
cannot read). It starts an S3 server on this host's loopback (no shared folder: the storage is
the control plane's alone) and a real control plane, starts a notebook session, and through
the control plane's proxy: gets its JupyterLab page over HTTP and runs a cell over the
kernel's WebSocket. A trial of another tenant on the same node then looks for every TCP port
listening where it runs and tries the relay's handshake without the secret on any it finds
(in its network namespace of its own, it finds none of its node's). It prints JSON
lines: ``session`` (where it ran, what the proxy answered) and ``intruder`` (that trial's log).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from tests.distributed.noshare_driver import emit, node_addresses
from tests.fixtures.control_plane import ControlPlaneProcess, pack_dir
from tests.fixtures.jupyter_kernel import run_cell
from tests.fixtures.seaweedfs import SeaweedS3

SERVE_TIMEOUT_S = 420.0

# a trial of another tenant on the session's node: every listening TCP port of the node, and
# what a connection without the relay's secret gets from the one that is a relay
INTRUDER = r"""
import socket
found = []
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    fields = line.split()
    local, state = fields[1], fields[3]
    if state != "0A":  # LISTEN
        continue
    hex_ip, hex_port = local.split(":")
    ip = socket.inet_ntoa(bytes.fromhex(hex_ip)[::-1])
    if ip.startswith("127."):
        continue
    port = int(hex_port, 16)
    try:
        with socket.create_connection((ip, port), timeout=3) as sock:
            sock.settimeout(3)
            first = sock.recv(200)
            if not first.startswith(b"trainhub-relay/1"):
                continue
            sock.sendall(b"0" * 64 + b"\n")  # a guessed answer
            print("RELAY", ip, port, "ANSWERED", sock.recv(100).decode().strip(), flush=True)
            found.append(port)
    except OSError:
        continue
print("RELAYS FOUND", len(found), flush=True)
"""

INTRUDER_SPEC = """\
name: intruder
entrypoint: python intruder.py
resources: {workers: 1, cpus_per_worker: 1}
max_restarts: 0
"""


def wait_serving(client: httpx.Client, session_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    session: dict[str, Any] = {}
    while time.monotonic() < deadline:
        session = client.get(f"/api/v1/sessions/{session_id}").json()
        if session["state"] in ("FAILED", "CANCELED", "COMPLETED"):
            raise RuntimeError(f"the session ended: {session}")
        if session["state"] == "RUNNING" and client.get(session["url"]).status_code == 200:
            return session
        time.sleep(0.5)
    raise RuntimeError(f"the session never served: {session}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="this host's private folder")
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--ip", required=True, help="this host's address on the cluster")
    parser.add_argument("--node-work", required=True, help="the worker node's folder")
    args = parser.parse_args()
    root = Path(args.root)
    weed_dir = root / "seaweedfs"
    weed_dir.mkdir()
    seaweed = SeaweedS3(weed_dir)
    plane: ControlPlaneProcess | None = None
    try:
        seaweed.start()
        home = root / "home" / "trainhub"
        home.mkdir(parents=True)
        plane = ControlPlaneProcess(
            home,
            args.ray_address,
            settings={
                "storage_url": seaweed.new_url("sessions"),
                "s3_endpoint": seaweed.endpoint,
                "host": "0.0.0.0",
                "monitor_interval_s": 0.0,
            },
            env=seaweed.env,
        )
        plane.settings["advertise_url"] = f"http://{args.ip}:{plane.port}"
        plane.start(timeout_s=120)
        admin = {"Authorization": f"Bearer {plane.token}"}
        from trainhub.client import TrainhubClient

        with TrainhubClient(plane.url, plane.token) as trainhub:
            trainhub.create_tenant("teamb")
            trainhub.create_user("bob")
            trainhub.set_membership("bob", "teamb", "member")
            bob = str(trainhub.create_token("bob", username="bob")["token"])
        with httpx.Client(base_url=plane.url, headers=admin, timeout=60) as client:
            started = client.post("/api/v1/sessions", json={"kind": "notebook"})
            started.raise_for_status()
            session = wait_serving(client, int(started.json()["id"]))
            base = session["url"].removesuffix("lab")
            page = client.get(session["url"])
            printed = run_cell(plane.url, base, plane.token, "print('kernel says', 6 * 7)")
            trial = plane.trial(int(session["trial_id"]))
            addresses = node_addresses(args.ray_address)
            placed = sorted({addresses.get(n, n) for n in trial["attempts"][0]["placement"]})
            refusals = {
                "none": httpx.get(plane.url + session["url"], timeout=60).status_code,
                "other_tenant": httpx.get(
                    plane.url + session["url"],
                    headers={"Authorization": f"Bearer {bob}"},
                    timeout=60,
                ).status_code,
            }
            emit(
                "session",
                page_status=page.status_code,
                page_is_lab="JupyterLab" in page.text,
                printed=printed,
                placed=placed,
                node_session=session.get("node"),
                # what this host sees of the node's folder (an empty cover: nothing, not even
                # the node's work folder)
                node_folder_seen=sorted(os.listdir(os.path.dirname(args.node_work))),
                refusals=refusals,
            )
            # a trial of another tenant, on the same node, while the session serves
            context = root / "intruder"
            context.mkdir()
            (context / "intruder.py").write_text(INTRUDER)
            submitted = httpx.post(
                f"{plane.url}/api/v1/experiments",
                headers={"Authorization": f"Bearer {bob}"},
                data={"spec": INTRUDER_SPEC},
                files={"context": ("c.tar.gz", pack_dir(context), "application/gzip")},
                timeout=60,
            )
            assert submitted.status_code == 201, submitted.text
            experiment = submitted.json()
            trial_id = int(experiment["trials"][0]["id"])
            ended = plane.wait_for(
                trial_id,
                lambda t: t["state"] in ("COMPLETED", "FAILED"),
                timeout_s=300,
                what="the intruder ended",
            )
            intruder_placed = sorted(
                {addresses.get(n, n) for n in ended["attempts"][0]["placement"]}
            )
            again = run_cell(plane.url, base, plane.token, "print('still', 7 * 6)")
            emit(
                "intruder",
                state=ended["state"],
                tenant=experiment.get("tenant"),
                placed=intruder_placed,
                log=plane.log(trial_id, 0),
                session_after=again,
            )
            client.post(f"/api/v1/sessions/{session['id']}/stop")
    finally:
        if plane is not None:
            print(json.dumps({"event": "server_log", "tail": plane.log_tail(40)}), flush=True)
            plane.stop()
        seaweed.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
