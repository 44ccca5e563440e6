"""Scheduling policies on the Philly trace, and the latency of one decision.

Prints one JSON line per policy (the full trace on a high-load cluster, all policies in the
same run, ratios against FIFO) and one line for the decision-latency micro-benchmark (1,000
nodes, 5,000 queued trials). Not part of the test run.

    .venv/bin/python benchmarks/scheduler.py                     # everything (minutes)
    .venv/bin/python benchmarks/scheduler.py --limit 20000       # a prefix of the trace
    .venv/bin/python benchmarks/scheduler.py --latency-only
    .venv/bin/python benchmarks/scheduler.py --jobs 2            # policies in parallel

Data: the Philly-derived trace of the Pollux artifact (CC-BY-4.0), ../shared/traces.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import (
    QueuedTrial,
    QueueIndex,
    RunningTrial,
    Snapshot,
    TenantShare,
    TrialQueue,
    create_policy,
    split_decisions,
)
from trainhub.core.scheduling.nodetable import NodeTable
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.spec import Priority
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig
from trainhub.sim.runner import guarantees_from_demand, load_trace, ratios, simulate

POLICIES = ("fifo", "sjf", "las", "fair")


def run_policy(args: tuple[str, int | None, int, int, Path | None]) -> dict[str, object]:
    policy, limit, nodes, gpus, traces = args
    trace = load_trace("philly", traces, limit)
    cluster = ClusterSpec.uniform(nodes, gpus)
    tenants = guarantees_from_demand(trace.jobs, cluster.total_gpus)
    started = time.perf_counter()
    result = simulate(trace.jobs, cluster, policy, tenants=tenants, sim=SimConfig())
    summary = result.summary()
    summary["wall_s"] = time.perf_counter() - started
    summary["sim_s"] = result.wall_s
    summary["trace"] = f"philly[:{limit}]" if limit else "philly"
    summary["cluster"] = cluster.describe()
    summary["tenants"] = {t: s.guaranteed_slots for t, s in sorted(tenants.items())}
    return summary


def _latency_cluster(rng: random.Random) -> tuple[list[Node], list[RunningTrial], list[str]]:
    """1,000 nodes x 8 GPUs, 97% busy (the usual state: a few GPUs freed since the last pass)."""
    tenants = [f"t{i:02d}" for i in range(20)]
    nodes: list[Node] = []
    running: list[RunningTrial] = []
    trial_id = 0
    for n in range(1000):
        node_id = f"node-{n:04d}"
        free = 8
        while free > 0 and rng.random() < 0.97:
            gpus = min(free, rng.choice([1, 1, 1, 2, 4, 8]))
            free -= gpus
            trial_id += 1
            running.append(
                RunningTrial(
                    trial_id=trial_id,
                    tenant=rng.choice(tenants),
                    request=ResourceRequest(gpus, 1, 0.0),
                    placement=(node_id,) * gpus,
                    started_at=rng.uniform(0, 90_000),
                    attained_service=rng.choice([0.0, 0.0, 10_000.0]),
                )
            )
        nodes.append(
            Node(
                node_id,
                8,
                64.0,
                free,
                64.0,
                gpu_model=rng.choice(["A100", "H100"]),
                gpu_temperature_c=rng.uniform(35, 90),
            )
        )
    return nodes, running, tenants


def _queued(rng: random.Random, trial_id: int, tenants: list[str]) -> QueuedTrial:
    sizes = [1] * 12 + [2, 2, 4, 4, 8, 8, 16, 32]
    return QueuedTrial(
        trial_id=trial_id,
        tenant=rng.choice(tenants),
        request=ResourceRequest(rng.choice(sizes), 1, 0.0),
        priority=rng.choice([Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.HIGH]),
        queued_at=rng.uniform(0, 100_000),
        submitted_at=rng.uniform(0, 100_000),
        attained_service=rng.choice([0.0, 0.0, 0.0, 5_000.0]),
    )


def latency(policy_name: str, mode: str, repeats: int, seed: int = 1) -> dict[str, object]:
    """One decision over 1,000 nodes x 8 GPUs and 5,000 queued trials of 20 tenants.

    Modes: ``cold``: plain tuples, so the policy indexes the whole queue, the nodes and the
    running trials inside the decision (a control plane's first tick); ``service``: what the
    control loop does on every later tick (``ControlLoop._schedule``): it reads the queue, the
    running trials and the nodes afresh and syncs the indexes it keeps (:class:`QueueIndex`,
    ``RunningTable.synced``, ``NodeTable.synced``) before deciding; since the last tick 1% of
    the queue changed (25 trials left, 25 arrived) and 25 running trials ended and 25 others
    started; the time counts the syncs; ``simulator``: the same indexed snapshot every time.
    """
    rng = random.Random(seed)
    nodes, running, tenants = _latency_cluster(rng)
    queue = [_queued(rng, 100_000 + i, tenants) for i in range(5000)]
    next_id = 200_000
    total = sum(n.total_gpus for n in nodes)
    shares = {t: TenantShare(guaranteed_slots=total // len(tenants)) for t in tenants}
    usage = {t: rng.uniform(0, 1e7) for t in tenants}
    times: list[float] = []
    cpu: list[float] = []
    reasons_cpu: list[float] = []
    starts = preempts = 0
    # one policy for all repeats, as a server keeps it: its caches stay warm between ticks
    policy = create_policy(policy_name)
    index = QueueIndex(policy.queue_order)
    node_table, running_table = NodeTable(()), RunningTable()
    if mode == "service":  # the ticks before
        index.sync(queue)
        node_table, running_table = node_table.synced(nodes), running_table.synced(running)
    indexed = Snapshot(
        now=100_000.0,
        nodes=NodeTable(nodes),
        queue=TrialQueue(queue, policy.queue_order),
        running=RunningTable(running),
        tenants=shares,
        tenant_usage=usage,
    )
    for _ in range(repeats):
        if mode == "service":
            # 1% churn: 25 trials started or were cancelled, 25 were submitted
            for _ in range(25):
                queue.pop(rng.randrange(len(queue)))
                queue.append(_queued(rng, next_id, tenants))
                next_id += 1
                # a running trial ended and another took its GPUs
                at = rng.randrange(len(running))
                running[at] = replace(running[at], trial_id=next_id, tenant=rng.choice(tenants))
                next_id += 1
            nodes = [replace(n) for n in nodes]  # read afresh: equal copies
        t0, c0 = time.perf_counter(), time.process_time()
        if mode == "simulator":
            snap = indexed
        elif mode == "service":
            queue_seen = index.sync(queue)
            node_table = node_table.synced(nodes)
            running_table = running_table.synced(running)
            snap = Snapshot(100_000.0, node_table, queue_seen, running_table, shares, usage)
        else:
            snap = Snapshot(100_000.0, tuple(nodes), tuple(queue), tuple(running), shares, usage)
        decisions = policy.decide(snap)
        split_decisions(decisions)  # what the scheduler carries out: starts and preemptions
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        c1 = time.process_time()
        made = list(decisions)  # every pending reason too, as the service stores them
        reasons_cpu.append(time.process_time() - c1)
        starts = sum(1 for d in made if type(d).__name__ == "Start")
        preempts = sum(1 for d in made if type(d).__name__ == "Preempt")
    times.sort()
    first = cpu[0]
    cpu.sort()
    return {
        "benchmark": "decision_latency",
        "policy": policy_name,
        "mode": mode,
        "nodes": len(nodes),
        "gpus": total,
        "free_gpus": sum(n.free_gpus for n in nodes),
        "running": len(running),
        "queued": len(queue),
        "starts": starts,
        "preempts": preempts,
        "repeats": repeats,
        "first_cpu_ms": round(first * 1e3, 2),
        "median_ms": round(statistics.median(times) * 1e3, 2),
        "max_ms": round(times[-1] * 1e3, 2),
        # CPU time of this process: what the decision costs when the machine is shared
        "median_cpu_ms": round(statistics.median(cpu) * 1e3, 2),
        "max_cpu_ms": round(max(cpu) * 1e3, 2),
        # reading all 5,000 pending decisions with their reasons afterwards
        "pending_reasons_cpu_ms": round(statistics.median(reasons_cpu) * 1e3, 2),
        "target_ms": 10.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N jobs of the trace")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--policy", action="append", choices=POLICIES)
    parser.add_argument("--jobs", type=int, default=1, help="policies simulated in parallel")
    parser.add_argument("--traces-dir", type=Path, default=None)
    parser.add_argument("--latency-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    if not args.latency_only:
        policies = args.policy or list(POLICIES)
        if "fifo" not in policies:
            policies = ["fifo", *policies]
        work = [(p, args.limit, args.nodes, args.gpus_per_node, args.traces_dir) for p in policies]
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                summaries = list(pool.map(run_policy, work))
        else:
            summaries = [run_policy(w) for w in work]
        fifo = next(s for s in summaries if s["policy"] == "fifo")
        for summary in summaries:
            line = dict(summary)
            ratios_ = ratios(summary, fifo) if summary is not fifo else {}
            line.update(ratios_)
            print(json.dumps(line), flush=True)
    for policy in ("fair", "fifo", "las"):
        for mode in ("cold", "service", "simulator"):
            print(json.dumps(latency(policy, mode, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
