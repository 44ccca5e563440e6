"""The node sampler on this machine: psutil always; NVML where a GPU and its driver exist."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from trainhub.adapters.monitor.agent import AgentLoop
from trainhub.adapters.monitor.nvml import GpuProbe
from trainhub.adapters.monitor.sampler import NodeSampler

PROBE = GpuProbe()
needs_gpu = pytest.mark.skipif(not PROBE.available, reason=PROBE.why_not or "no GPU")


def test_a_sample_reads_cpu_memory_disk_and_network() -> None:
    sampler = NodeSampler("here", gpus=PROBE)
    sample = sampler.sample()
    assert sample.node_id == "here"
    assert 0.0 <= sample.cpu_pct <= 100.0
    assert 0.0 < sample.memory_used_gb < sample.memory_total_gb
    assert 0.0 < sample.disk_used_pct <= 100.0
    assert sample.net_recv_bytes >= 0
    assert abs(sample.at - time.time()) < 5


def test_the_inventory_names_cpu_memory_and_interfaces() -> None:
    inventory = NodeSampler("here", gpus=PROBE).inventory()
    assert inventory.num_cores == os.cpu_count()
    assert inventory.cpu_model
    assert inventory.memory_gb > 0
    assert all({"name", "speed_mbps", "address"} <= n.keys() for n in inventory.nics)


def test_a_cpu_node_reports_no_gpus_and_says_why() -> None:
    if PROBE.available:
        pytest.skip("this machine has a GPU")
    assert PROBE.sample() == ()
    assert PROBE.inventory() == ()
    assert PROBE.why_not.startswith("NVML unavailable")


def test_a_trial_process_tree_is_attributed_to_its_trial() -> None:
    env = {**os.environ, "TRAINHUB_TRIAL_ID": "4242"}
    busy = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", busy], env=env)
    try:
        sampler = NodeSampler("here", gpus=PROBE)
        sampler.sample()  # the first reading of a process starts its CPU interval
        time.sleep(0.5)
        trials = sampler.sample().trials
        assert 4242 in trials
        cpu_pct, rss_gb = trials[4242]
        assert cpu_pct > 1.0  # a busy loop; on a loaded machine it may get little of a core
        assert rss_gb > 0.001
    finally:
        child.kill()
        child.wait()


def test_the_agent_loop_samples_on_its_own_thread() -> None:
    loop = AgentLoop("here", interval_s=0.1)
    try:
        deadline = time.monotonic() + 5
        samples = []
        while len(samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
            samples += loop.drain()
        assert len(samples) >= 3
        assert loop.drain() == [] or len(loop.drain()) <= 1  # drained means taken
    finally:
        loop.stop()


@needs_gpu
def test_nvml_reads_every_gpu() -> None:
    gpus = PROBE.sample()
    assert gpus
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert 0 <= gpu.utilization_pct <= 100
        assert gpu.memory_total_gb > 0
        assert 10 < gpu.temperature_c < 110
    inventory = PROBE.inventory()
    assert len(inventory) == len(gpus)
    assert inventory[0]["driver"]
