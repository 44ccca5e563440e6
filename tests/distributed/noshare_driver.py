"""The control-plane host's part of tests/distributed/test_no_shared_folder.py.

Run on the control-plane host of :func:`tests.distributed.private_nodes.private_cluster`: it
starts an S3 server (SeaweedFS, on this host's loopback: only the control plane talks to it), a
package index (a folder of wheels served over HTTP on the cluster's network, what the nodes
install from), and a real control plane on the Ray cluster with ``--storage s3://...``. It
pushes a dataset, submits a two-rank trial that needs an environment, the dataset and its
checkpoint, waits for a checkpoint, kills the node the ranks run on, and waits for the trial
to complete elsewhere. It prints JSON lines: ``started``, ``killed`` and ``result`` (the
trial, its logs and metrics, the bucket's keys), which the test checks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.distributed.netns import _kill_namespace_processes
from tests.fixtures.control_plane import ControlPlaneProcess
from tests.fixtures.seaweedfs import SeaweedS3
from tests.fixtures.wheels import make_wheel
from trainhub.adapters.storage.s3 import S3ArtifactStore

STEPS = 24

TRAIN = """\
import os, time
import torch
import torch.distributed as dist
import trainhub
from trainhub.data.mounted import mounted_path
from tinypkg import GREETING  # from the environment installed on this node

ctx = trainhub.init()
data = (mounted_path("/data/greetings") / "greeting.txt").read_text().strip()
print(f"rank {ctx.rank}: {GREETING}, data says {data}", flush=True)
# what of the hosts' private folders this rank sees: its own node's alone
for folder in os.environ["PRIVATE_FOLDERS"].split(":"):
    print(f"SEES {folder} {os.path.exists(folder)}", flush=True)
state = ctx.restore()
start = 0 if state is None else state["step"] + 1
total = torch.zeros(4) if state is None else state["total"]
if state is not None:
    print(f"rank {ctx.rank} resumed at step {start}", flush=True)
for step in range(start, STEPS):
    ones = torch.ones(4)
    dist.all_reduce(ones)  # both ranks take part in every step
    total += ones
    ctx.report(step=step, loss=1.0 / (step + 1))
    if step % 2 == 1:
        ctx.save_checkpoint({"step": step, "total": total}, step=step)
    print(f"step {step}", flush=True)
    time.sleep(0.5)
ctx.close(timeout_s=120)
print(f"rank {ctx.rank} done: total {int(total[0])}", flush=True)
""".replace("STEPS", str(STEPS))

SPEC = """\
name: no-shared-folder
entrypoint: python train.py
resources: {workers: 2, cpus_per_worker: 1, placement: pack}
environment: {packages: [tinypkg==1.0], variables: {PRIVATE_FOLDERS: "@FOLDERS@"}}
data: [{name: greetings, mount: /data/greetings}]
checkpoints: {keep_latest: 2}
max_restarts: 2
"""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def node_addresses(ray_address: str) -> dict[str, str]:
    """Ray node id -> the node's address, asked of the cluster (as a driver of its own)."""
    import ray

    ray.init(address=ray_address, log_to_driver=False, namespace="noshare-driver")
    try:
        return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="this host's private folder")
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--ip", required=True, help="this host's address on the cluster")
    parser.add_argument("--wheels-port", type=int, required=True)
    parser.add_argument("--nodes", required=True, help="JSON {ip: network namespace}")
    parser.add_argument("--private", required=True, help="the folders a rank must not see")
    args = parser.parse_args()
    root = Path(args.root)
    namespaces: dict[str, str] = json.loads(args.nodes)

    # a package index (PEP 503's simple layout, static files) the hosts reach over HTTP
    wheels = root / "index"
    wheel = make_wheel(wheels, "tinypkg", "1.0", "GREETING = 'hello from tinypkg'")
    page = wheels / "simple" / "tinypkg" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../{wheel.name}">{wheel.name}</a>\n')
    index = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(args.wheels_port), "--bind", args.ip,
         "--directory", str(wheels)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    weed_dir = root / "seaweedfs"
    weed_dir.mkdir()
    seaweed = SeaweedS3(weed_dir)
    plane: ControlPlaneProcess | None = None
    try:
        seaweed.start()
        url = seaweed.new_url("noshare")
        home = root / "home" / "trainhub"
        home.mkdir(parents=True)
        plane = ControlPlaneProcess(
            home,
            args.ray_address,
            settings={
                "storage_url": url,
                "s3_endpoint": seaweed.endpoint,
                "host": "0.0.0.0",
                "monitor_interval_s": 0.0,
            },
            env=seaweed.env,  # the bucket's credentials: the control plane's alone
        )
        plane.settings["advertise_url"] = f"http://{args.ip}:{plane.port}"
        plane.start(timeout_s=120)
        from trainhub.client import TrainhubClient
        from trainhub.client.datasets import push_dataset

        folder = root / "greetings"
        folder.mkdir()
        (folder / "greeting.txt").write_text("hello from the bucket\n")
        with TrainhubClient(plane.url, plane.token) as client:
            push_dataset(client, "greetings", folder)
        context = root / "context"
        context.mkdir()
        (context / "train.py").write_text(TRAIN)
        experiment = plane.submit(SPEC.replace("@FOLDERS@", args.private), context)
        trial_id = experiment["trials"][0]["id"]
        reasons: set[str] = set()

        def checkpointed(trial: dict[str, Any]) -> bool:
            if trial.get("pending_reason"):
                reasons.add(trial["pending_reason"])
            steps = [c["step"] for c in trial.get("checkpoints", [])]
            return trial["state"] == "RUNNING" and bool(steps) and max(steps) >= 3

        trial = plane.wait_for(trial_id, checkpointed, timeout_s=400, what="checkpointed")
        addresses = node_addresses(args.ray_address)
        (ip,) = {addresses[node] for node in trial["attempts"][0]["placement"]}
        emit("started", trial_id=trial_id, ip=ip, reasons=sorted(reasons))
        _kill_namespace_processes(namespaces[ip])
        emit("killed", ip=ip)

        def noted(trial: dict[str, Any]) -> bool:
            if trial.get("pending_reason"):
                reasons.add(trial["pending_reason"])
            return trial["state"] == "COMPLETED"

        trial = plane.wait_for(trial_id, noted, timeout_s=600, what="COMPLETED elsewhere")
        placements = {
            str(a["number"]): sorted({addresses.get(n, n) for n in a["placement"]})
            for a in trial["attempts"]
        }
        logs = {
            f"{attempt}/{rank}": plane.log(trial_id, rank, attempt=attempt)
            for attempt in range(1, trial["num_attempts"] + 1)
            for rank in (0, 1)
        }
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        listed = seaweed.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
        # logs are segment objects beside the prefix (s3_segments.py), one blob each to the store
        store = S3ArtifactStore(url, endpoint_url=seaweed.endpoint, client=seaweed.client())
        logs_stored = [f"{prefix}/{b.key}" for b in store.list("tenants/default/logs/")]
        envs = plane.request("GET", "/environments").json()
        emit(
            "result",
            trial=trial,
            logs=logs,
            placements=placements,
            metrics=plane.metrics(trial_id),
            reasons=sorted(reasons),
            keys=sorted([*(o["Key"] for o in listed.get("Contents", [])), *logs_stored]),
            environments=envs,
            home_files=sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()),
            server_log=plane.log_tail(60),
        )
    finally:
        if plane is not None:
            plane.stop()
        seaweed.stop()
        index.terminate()
        index.wait(10)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
