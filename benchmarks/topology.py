"""The network as a tenant resource (issue 30): traffic attribution, topology-aware gangs,
and the co-flow experiment of docs/adr/0046. JSON lines:

- ``traffic_attribution``: two network namespaces joined by a veth pair (two "nodes" on this
  machine), a known TCP transfer from one to the other; the bytes attributed to the sender
  from its namespace's kernel counters (adapters/trial_traffic.py, core/traffic.py) against
  the bytes the application sent. Then a real two-rank gloo DDP run (the runtime's metered
  all-reduce hook) across the same pair: the hooks' figure against the counters'.
  Needs root (namespaces); says so otherwise.
- ``topology``: the fair policy on "2 blocks x 4 racks x 4 nodes x 8 GPUs" (256 GPUs) over a
  seeded synthetic workload (sizes 1-32 GPUs, 1 GPU per rank, lognormal durations, offered at
  about the cluster's capacity), once topology-aware (gangs larger than a node and fitting a
  rack ``required: rack``, the others ``preferred: rack``) and once topology-blind (the same
  jobs without topology: plain best fit), with the step-time penalty of sim/network.py for a
  gang spanning wider than it needed. ``decision_median_ms``: the aware policy's decisions
  on 1,000 labelled nodes (5 blocks x 20 racks x 10 nodes x 8 GPUs), timed per pass of a
  simulation that keeps about 200 trials waiting.
- ``coflow``: two all-reduce gangs sharing a rack uplink, their sync phases staggered or not
  (sim/coflow.py).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/topology.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from trainhub.core.scheduling import BasePolicy, Decision, FairShareConfig, Snapshot, create_policy
from trainhub.core.topology import TopologyNeed
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.coflow import simulate_coflow
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.network import NetworkModel
from trainhub.sim.runner import guarantees_from_demand
from trainhub.sim.sweep import topology_line
from trainhub.sim.trace import TraceJob

SIZES = ((1, 0.30), (2, 0.10), (4, 0.15), (8, 0.15), (16, 0.15), (24, 0.08), (32, 0.07))
TENANTS = ("a", "b", "c", "d")


def workload(num_jobs: int, total_gpus: int, load: float, seed: int) -> list[TraceJob]:
    """Seeded jobs whose GPU-time, spread over their arrivals, is ``load`` x the cluster."""
    rng = random.Random(seed)
    sizes, weights = zip(*SIZES, strict=True)
    jobs = []
    for i in range(num_jobs):
        size = rng.choices(sizes, weights)[0]
        duration = min(rng.lognormvariate(math.log(3600.0), 1.0), 48 * 3600.0)
        jobs.append(TraceJob(i, 0.0, duration, size, rng.choice(TENANTS)))
    mean_work = sum(j.num_gpus * j.duration_s for j in jobs) / num_jobs
    gap = mean_work / (load * total_gpus)  # mean inter-arrival time for that load
    now = 0.0
    timed = []
    for j in jobs:
        timed.append(replace(j, submit_s=now))
        now += rng.expovariate(1.0 / gap)
    return timed


def aware(jobs: Sequence[TraceJob], gpus_per_node: int, rack_gpus: int) -> list[TraceJob]:
    """The same jobs asking for racks: required where the gang needs more than a node and
    fits a rack, preferred otherwise."""
    out = []
    for j in jobs:
        required = gpus_per_node < j.num_gpus <= rack_gpus
        out.append(replace(j, topology=TopologyNeed("rack", required)))
    return out


class Timed(BasePolicy):
    """Times each pass of the policy it wraps (the simulator calls it once a pass)."""

    def __init__(self, inner: BasePolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.queue_order = inner.queue_order
        self.standing_half_life_s = inner.standing_half_life_s
        self.reads_queued_durations = inner.reads_queued_durations
        self.reads_running_durations = inner.reads_running_durations
        self.config = getattr(inner, "config", None)
        self.ms: list[float] = []

    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        start = time.perf_counter()
        decisions = self.inner.decide(snapshot)
        self.ms.append((time.perf_counter() - start) * 1000.0)
        return decisions


def fair() -> BasePolicy:
    return create_policy("fair", fair=FairShareConfig())


def topology(num_jobs: int, seed: int) -> dict[str, object]:
    cluster = ClusterSpec.racks(2, 4, 4, 8)
    rack_gpus = cluster.domain_gpus("rack")
    jobs = workload(num_jobs, cluster.total_gpus, 1.0, seed)
    tenants = guarantees_from_demand(jobs, cluster.total_gpus)
    config = SimConfig(network=NetworkModel())
    blind = Simulator(jobs, cluster, fair(), tenants, config).run().summary()
    smart = Simulator(aware(jobs, 8, rack_gpus), cluster, fair(), tenants, config).run()
    line = topology_line("2x4x4x8", smart.summary(), blind)
    return {
        "benchmark": "topology",
        "cluster": "2 blocks x 4 racks x 4 nodes x 8 GPUs",
        "jobs": num_jobs,
        "single_rack_gangs": line["single_rack_gangs"],
        "best_fit_single_rack_gangs": line["best_fit_single_rack_gangs"],
        "fragmentation": line["fragmentation"],
        "best_fit_fragmentation": line["best_fit_fragmentation"],
        "avg_jct_vs_topology_blind": line["avg_jct_vs_topology_blind"],
        "avg_jct_h": round(float(smart.summary()["avg_jct_s"]) / 3600.0, 3),  # type: ignore[arg-type]
        "blind_avg_jct_h": round(float(blind["avg_jct_s"]) / 3600.0, 3),  # type: ignore[arg-type]
        "spans": smart.extra.get("spans"),
        "blind_spans": blind.get("extra", {}).get("spans"),  # type: ignore[union-attr]
        "decision_median_ms": None,
    }


def decision_latency(num_jobs: int, seed: int, topology: bool = True) -> tuple[float, float, int]:
    """Median and p99 of the fair policy's passes on 1,000 labelled nodes (its jobs asking
    for racks, or not: the baseline), and the number of passes timed (past the first quarter,
    once the queue has formed)."""
    cluster = ClusterSpec.racks(5, 20, 10, 8)
    assert len(cluster.nodes) == 1000
    jobs = workload(num_jobs, cluster.total_gpus, 1.3, seed)
    if topology:
        jobs = aware(jobs, 8, cluster.domain_gpus("rack"))
    policy = Timed(fair())
    tenants = guarantees_from_demand(jobs, cluster.total_gpus)
    Simulator(jobs, cluster, policy, tenants, SimConfig(network=NetworkModel())).run()
    kept = policy.ms[len(policy.ms) // 4 :]  # past the warm-up, when the queue has formed
    ordered = sorted(kept)
    return statistics.median(kept), ordered[int(0.99 * (len(ordered) - 1))], len(kept)


# -- traffic attribution ---------------------------------------------------------------------


def traffic(megabytes: int) -> dict[str, object]:
    from trainhub.adapters import trial_network, trial_traffic
    from trainhub.core.traffic import NamespaceSample, Scope

    problem = trial_network.network_problem() or (None if shutil.which("ip") else "no `ip`")
    if problem is not None:
        return {"benchmark": "traffic_attribution", "skipped": problem}

    def sample(network: trial_network.TrialNetwork) -> NamespaceSample:
        fd = network.open()
        try:
            return NamespaceSample(network.name, tuple(trial_traffic.read_namespace(fd).items()))
        finally:
            os.close(fd)

    def inside(network: trial_network.TrialNetwork, make: object) -> socket.socket:
        made: list[socket.socket] = []

        def run() -> None:
            fd = network.open()
            trial_network.join(fd)
            os.close(fd)
            made.append(make())  # type: ignore[operator]

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return made[0]

    tag = uuid.uuid4().hex[:8]
    a = trial_network.TrialNetwork.ensure(f"th-bench-{tag}-a", [])
    b = trial_network.TrialNetwork.ensure(f"th-bench-{tag}-b", [])
    ip = shutil.which("ip") or "ip"
    try:
        for argv in (
            [ip, "link", "add", f"tb{tag}a", "netns", a.name, "type", "veth", "peer", "name",
             f"tb{tag}b", "netns", b.name],
            [ip, "-n", a.name, "address", "add", "10.232.0.1/24", "dev", f"tb{tag}a"],
            [ip, "-n", b.name, "address", "add", "10.232.0.2/24", "dev", f"tb{tag}b"],
            [ip, "-n", a.name, "link", "set", f"tb{tag}a", "up"],
            [ip, "-n", b.name, "link", "set", f"tb{tag}b", "up"],
        ):  # fmt: skip
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        sent = megabytes << 20
        before = sample(a).flows()[Scope.INTER].sent
        server = inside(b, lambda: socket.create_server(("10.232.0.2", 0)))
        port = server.getsockname()[1]
        got: list[int] = []

        def serve() -> None:
            conn, _ = server.accept()
            total = 0
            while data := conn.recv(1 << 16):
                total += len(data)
            got.append(total)
            conn.close()

        reader = threading.Thread(target=serve)
        reader.start()
        client = inside(a, lambda: socket.create_connection(("10.232.0.2", port), timeout=30))
        block = b"x" * (1 << 20)
        for _ in range(megabytes):
            client.sendall(block)
        client.shutdown(socket.SHUT_WR)
        client.recv(1)
        client.close()
        reader.join(60)
        server.close()
        attributed = sample(a).flows()[Scope.INTER].sent - before
        line: dict[str, object] = {
            "benchmark": "traffic_attribution",
            "bytes_sent": sent,
            "bytes_received": got[0] if got else None,
            "attributed": attributed,
            "error": round(abs(attributed - sent) / sent, 5),
        }
        line.update(hooks_vs_counters(a, b, tag, sample))
        return line
    finally:
        a.remove()
        b.remove()


RANK = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
from trainhub.adapters import trial_network
trial_network.join(fd)
import torch, torch.distributed as dist
from trainhub.runtime.distributed.strategies import AllReduceStrategy
dist.init_process_group("gloo", init_method="tcp://10.232.0.1:29544",
                        rank=int(os.environ["RANK"]), world_size=2)
torch.manual_seed(0)
model = AllReduceStrategy().wrap(torch.nn.Linear(1024, 1024), device=torch.device("cpu"))
for _ in range(int(sys.argv[2])):
    model(torch.randn(8, 1024)).sum().backward()
dist.barrier()
dist.destroy_process_group()
"""


def hooks_vs_counters(a: object, b: object, tag: str, sample: object) -> dict[str, object]:
    """A two-rank gloo DDP run across the pair: rank 0's hooks' wire bytes vs its counters."""
    from trainhub.adapters import trial_traffic
    from trainhub.core.traffic import Scope

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "rank.py"
        script.write_text(RANK)
        before = {r: sample(n).flows()[Scope.INTER].sent for r, n in enumerate((a, b))}  # type: ignore[operator]
        procs = []
        for rank, network in enumerate((a, b)):
            spool = Path(folder) / f"n{rank}"
            spool.mkdir()
            env = {**os.environ, "RANK": str(rank), "TRAINHUB_SPOOL_DIR": str(spool),
                   "GLOO_SOCKET_IFNAME": f"tb{tag}{'ab'[rank]}"}  # fmt: skip
            procs.append(
                subprocess.Popen([sys.executable, str(script), str(network.path), "30"], env=env)  # type: ignore[attr-defined]
            )
        codes = [p.wait(timeout=300) for p in procs]
        if any(codes):
            return {"hooks_vs_counters": None, "hooks_note": f"ranks exited {codes}"}
        hooks = trial_traffic.read_hooks(Path(folder) / "n0", 0) or 0
        counted = sample(a).flows()[Scope.INTER].sent - before[0]  # type: ignore[operator]
    return {
        "hooks_bytes": hooks,
        "counter_bytes": counted,
        "hooks_vs_counters": round(abs(hooks - counted) / counted, 5) if counted else None,
    }


def coflow() -> dict[str, object]:
    runs = {st: [simulate_coflow(staggered=st, seed=s) for s in range(5)] for st in (False, True)}
    plain = statistics.mean(r.slowdown for r in runs[False])
    staggered = statistics.mean(r.slowdown for r in runs[True])
    return {
        "benchmark": "coflow",
        "setup": "2 gangs, 60 ms compute + 2 GB all-reduce over a shared 400 Gb/s uplink "
        "(40 ms alone), 200 steps, 2% compute jitter, 5 seeds",
        "step_vs_alone_unstaggered": round(plain, 4),
        "step_vs_alone_staggered": round(staggered, 4),
        "overlap_share_unstaggered": round(
            statistics.mean(r.overlap_share for r in runs[False]), 4
        ),
        "overlap_share_staggered": round(statistics.mean(r.overlap_share for r in runs[True]), 4),
        "staggered_vs_unstaggered": round(staggered / plain, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs of the topology cell")
    parser.add_argument("--latency-jobs", type=int, default=3000)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-traffic", action="store_true")
    args = parser.parse_args()
    if not args.skip_traffic:
        print(json.dumps(traffic(args.megabytes)), flush=True)
    line = topology(args.jobs, args.seed)
    median, p99, passes = decision_latency(args.latency_jobs, args.seed)
    blind_median, _, _ = decision_latency(args.latency_jobs, args.seed, topology=False)
    line["decision_median_ms"] = round(median, 3)
    line["decision_p99_ms"] = round(p99, 3)
    line["decision_passes"] = passes
    line["decision_nodes"] = 1000
    line["blind_decision_median_ms"] = round(blind_median, 3)
    print(json.dumps(line), flush=True)
    print(json.dumps(coflow()), flush=True)


if __name__ == "__main__":
    main()
