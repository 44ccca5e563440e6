"""Two contained trials across the two Ray nodes of :mod:`tests.distributed.netns`.

Run as a Ray driver inside namespace A (``TwoHostCluster.run_driver``) with the real executor:
sandboxed ranks (bwrap, seccomp, cgroups, a network namespace per trial on each node and a
tunnel between a trial's nodes). Trial X's two ranks, one per node, rendezvous with a script's
own ``init_process_group("env://")``, all-reduce, and rank 1 connects to a port rank 0
serves; then trial Y's two ranks (the same nodes) try X's serving address, and every rank of
both tries the hosts' PostgreSQL-like listener and Ray's GCS port. Prints one JSON line with
each rank's output and what was left on the nodes after the attempts were released.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import ray
from ray.util.placement_group import get_placement_group

from tests.distributed.netns import HEAD_IP, RAY_PORT, WORKER_IP
from tests.fixtures.ray_cluster import Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.core.attempts import AttemptPhase
from trainhub.core.isolation import NodeIsolation
from trainhub.core.spec import Placement
from trainhub.service.ports import AttemptLaunch

SCRIPT = r"""
import errno, json, os, socket, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="env://")  # the script's own rendezvous
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print("ALLREDUCE", total.item(), os.environ["MASTER_ADDR"], flush=True)


def probe(name, host, port):
    sock = socket.socket()
    sock.settimeout(3)
    code = sock.connect_ex((host, int(port)))
    sock.close()
    print("PROBE", name, "REACHED" if code == 0 else errno.errorcode.get(code, code), flush=True)


for name, (host, port) in json.loads(os.environ["PROBES"]).items():
    probe(name, host, port)
if os.environ.get("SERVE_S"):
    port = torch.tensor([0])
    if rank == 0:
        server = socket.socket()
        server.bind(("0.0.0.0", 0))
        server.listen(8)
        server.settimeout(0.5)
        port[0] = server.getsockname()[1]
    dist.broadcast(port, 0)
    if rank == 0:
        print("SERVING", os.environ["MASTER_ADDR"], int(port), flush=True)
        deadline = time.monotonic() + float(os.environ["SERVE_S"])
        while time.monotonic() < deadline:
            try:
                conn, peer = server.accept()
            except socket.timeout:
                continue
            print("ACCEPTED", peer[0], flush=True)
            conn.sendall(b"hello")
            conn.close()
    else:
        with socket.create_connection((os.environ["MASTER_ADDR"], int(port)), timeout=10) as s:
            print("PEER_SAYS", s.recv(5).decode(), flush=True)
else:
    dist.barrier()  # both ranks done with the group (X's rank 0 serves on until stopped)
dist.destroy_process_group()
print("DONE", flush=True)
# no interpreter exit: a gloo rank whose peer has left may abort or hang in torch's destructors
# at exit ("terminate called without an active exception", code 134), which is not what this
# test is about
os._exit(0)
"""


def launch(executor: RayExecutor, nodes: list[str], probes: dict[str, object], **env: str) -> str:
    key = new_attempt_key("tun")
    executor.launch(
        AttemptLaunch(
            attempt_key=key,
            trial_id=int(time.time() * 1000) % 100000,
            attempt=1,
            argv=("python", "trial.py"),
            context_archive=make_context({"trial.py": SCRIPT}),
            env={"PROBES": json.dumps(probes), "OMP_NUM_THREADS": "1", **env},
            placement=tuple(nodes),
            cpus_per_worker=0.5,
            memory_gb_per_worker=1,
            strategy=Placement.SPREAD,
        )
    )
    return key


def main() -> None:
    work = Path(os.environ["TUNNEL_WORK_DIR"])
    executor = RayExecutor(
        os.environ["RAY_ADDRESS"],
        namespace="tunnel-test",
        sandbox="bwrap",
        node_work_dir=str(work),
        # `ip netns exec` (how the harness starts its Ray nodes) mounts a /sys of the namespace:
        # the cgroup hierarchies are not there, so these ranks run without cgroups
        isolation=NodeIsolation(cgroups=False),
    )
    by_ip = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes()}
    nodes = [by_ip[HEAD_IP], by_ip[WORKER_IP]]
    postgres = socket.socket()  # stands for the host's database (namespace A is private)
    postgres.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    postgres.bind((HEAD_IP, 5432))
    postgres.listen(8)
    host_probes = {
        "postgres_head": (HEAD_IP, 5432),
        "ray_gcs_head": (HEAD_IP, RAY_PORT),
        "postgres_loopback": ("127.0.0.1", 5432),
    }
    before = set(Path("/run/netns").glob("th-*"))
    x = launch(executor, nodes, host_probes, SERVE_S="120")
    watch_x = Watch(executor, x)
    status = watch_x.until(lambda s: "SERVING" in watch_x.text(0) or s.phase == "exited", 240)
    serving = next((ln for ln in watch_x.text(0).splitlines() if ln.startswith("SERVING")), "")
    if not serving:
        raise SystemExit(f"trial X did not serve: {status}\n{watch_x.text(0)}\n{watch_x.text(1)}")
    _, address, port = serving.split()
    y = launch(executor, nodes, {**host_probes, "other_trials_rank0": (address, int(port))})
    watch_y = Watch(executor, y)
    status = watch_y.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=240)
    y_codes = [r.exit_code for r in status.ranks]
    executor.terminate(x, grace_s=1)
    status = watch_x.until_phase(AttemptPhase.EXITED, AttemptPhase.LOST, timeout_s=60)
    x_codes = [r.exit_code for r in status.ranks]
    # the attempts' network names start with their placement groups' ids (containment.py);
    # other tests' trials (other pytest workers) make and remove theirs meanwhile
    ours = tuple(f"th-{get_placement_group(k).id.hex()}" for k in (x, y))
    executor.release(x)
    executor.release(y)
    time.sleep(2)
    left = sorted(
        p.name for p in set(Path("/run/netns").glob("th-*")) - before if p.name.startswith(ours)
    )
    print(
        json.dumps(
            {
                "x": {r: watch_x.text(r) for r in (0, 1)},
                "y": {r: watch_y.text(r) for r in (0, 1)},
                "x_codes": x_codes,
                "y_codes": y_codes,
                "netns_left": left,
            }
        ),
        flush=True,
    )
    postgres.close()


if __name__ == "__main__":
    sys.exit(main())
