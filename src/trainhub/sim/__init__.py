"""Trace-driven cluster simulator: replays job traces through the core scheduling policies.

from trainhub.sim import ClusterSpec, compare, load_trace

trace = load_trace("philly", limit=5000)
for result in compare(trace.jobs, ClusterSpec.uniform(64, 8), ["fair", "fifo"]):
    print(result.summary())
"""

from trainhub.sim.cluster import ClusterSpec, NodeSpec
from trainhub.sim.engine import SimConfig, SimulationError, Simulator
from trainhub.sim.metrics import JobRecord, SimResult
from trainhub.sim.runner import (
    TRACE_NAMES,
    Trace,
    compare,
    guarantees_from_demand,
    load_trace,
    ratios,
    simulate,
)
from trainhub.sim.trace import TraceJob

__all__ = [
    "TRACE_NAMES",
    "ClusterSpec",
    "JobRecord",
    "NodeSpec",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Simulator",
    "Trace",
    "TraceJob",
    "compare",
    "guarantees_from_demand",
    "load_trace",
    "ratios",
    "simulate",
]
