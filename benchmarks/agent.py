"""What the node monitoring agent costs (issue 10: < 1% of a core per node), measured.

A local Ray head (one node) runs two actors of the agent's class side by side for the same
window: the agent sampling every ``--interval-s`` (default 5 s, the server's default), and a
baseline that sampled once and then only sleeps (the cost of an idle Ray actor process). The
CPU time of each process over the window is read with psutil; the agent's figure includes
the idle cost of its process, i.e. all it costs the node. It also times one sample
in-process (``cpu_ms_per_sample``: CPU time of psutil + NVML readings and the process scan).

One JSON line: ``{"benchmark": "agent", "core_fraction", "baseline_core_fraction", "ratio",
"interval_s", "window_s", "cpu_ms_per_sample", "gpus"}`` (target: core_fraction < 0.01).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/agent.py [--window-s 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def per_sample_ms(samples: int = 20) -> tuple[float, int]:
    from trainhub.adapters.monitor.sampler import NodeSampler

    sampler = NodeSampler("bench")
    sampler.sample()  # the first call reads every process's environment once
    started = time.process_time()
    for _ in range(samples):
        sample = sampler.sample()
    return (time.process_time() - started) / samples * 1000, len(sample.gpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--interval-s", type=float, default=5.0)
    args = parser.parse_args()

    import psutil
    import ray

    from trainhub.adapters.monitor.agent import NodeAgent
    from trainhub.adapters.ray_executor import ensure_local_ray
    from trainhub.adapters.ray_executor.executor import connect
    from trainhub.adapters.ray_executor.local_cluster import stop_local_ray

    cpu_ms, gpus = per_sample_ms()
    state = Path(tempfile.mkdtemp(prefix="trainhub-bench-agent-")) / "ray"
    address = ensure_local_ray(state, num_cpus=1)
    try:
        connect(address, "trainhub-bench-agent")
        remote = ray.remote(num_cpus=0)(NodeAgent)
        agent = remote.remote("bench", args.interval_s)
        baseline = remote.remote("bench", 10 * args.window_s)
        procs = [psutil.Process(ray.get(a.pid.remote(), timeout=120)) for a in (agent, baseline)]
        time.sleep(2 * args.interval_s)  # both started and settled
        before = [p.cpu_times() for p in procs]
        started = time.monotonic()
        time.sleep(args.window_s)
        after = [p.cpu_times() for p in procs]
        window = time.monotonic() - started
        fractions = [
            ((a.user + a.system) - (b.user + b.system)) / window
            for a, b in zip(after, before, strict=True)
        ]
        drained = len(ray.get(agent.drain.remote()))
    finally:
        ray.shutdown()
        stop_local_ray(state)
    print(
        json.dumps(
            {
                "benchmark": "agent",
                "core_fraction": round(fractions[0], 5),
                "baseline_core_fraction": round(fractions[1], 5),
                "ratio": round(fractions[0] / fractions[1], 2) if fractions[1] > 0 else None,
                "interval_s": args.interval_s,
                "window_s": round(window, 1),
                "samples_taken": drained,
                "cpu_ms_per_sample": round(cpu_ms, 2),
                "gpus": gpus,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
