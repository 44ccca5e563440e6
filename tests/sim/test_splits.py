"""Issue 27: no tuning window of the scheduler benchmark overlaps a window it is scored on.

The windows are runs of consecutive jobs of a trace (``sim.sweep.load_window``): from
``int(len(trace) * start_fraction)``, 8 jobs per GPU of the cluster, cut where the trace ends.
Only the traces' lengths matter, so the test needs neither ../shared nor a simulation.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# loaded from its file, not by putting benchmarks/ on sys.path: its modules' names (datasets,
# models, agent) would shadow packages for every later test of the process
_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduler.py"
_SPEC = importlib.util.spec_from_file_location("benchmarks_scheduler", _PATH)
assert _SPEC is not None
assert _SPEC.loader is not None
scheduler = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = scheduler  # its dataclasses look their module up
_SPEC.loader.exec_module(scheduler)

# jobs in the traces the benchmark reads (docs/scheduler.md: Philly's 82,247 jobs; openb's
# 6,203 pods)
TRACE_JOBS = {"philly": 82_247, "openb": 6_203}
JOBS_PER_GPU = 8


def _span(trace: str, nodes: int, start_fraction: float) -> range:
    total = TRACE_JOBS[trace]
    first = int(total * start_fraction)
    return range(first, min(total, first + JOBS_PER_GPU * nodes * 8))


def test_no_tuning_window_overlaps_a_test_window() -> None:
    tests = [
        (trace, nodes, _span(trace, nodes, scheduler.TEST_START))
        for trace in scheduler.TRACES
        for nodes in scheduler.NODES
    ]
    assert len(scheduler.TUNE_WINDOWS) >= 5
    for trace, nodes, start in scheduler.TUNE_WINDOWS:
        tuning = _span(trace, nodes, start)
        assert len(tuning) == JOBS_PER_GPU * nodes * 8  # a whole window, not cut by the end
        for test_trace, test_nodes, test in tests:
            if test_trace == trace:
                overlap = range(max(tuning.start, test.start), min(tuning.stop, test.stop))
                assert not overlap, (trace, nodes, start, test_nodes)


def test_the_tuning_split_has_a_small_cluster_per_trace() -> None:
    """The smallest test clusters (16 nodes) have tuning windows of their size (ADR 0036)."""
    small = min(scheduler.NODES)
    assert {t for t, nodes, _ in scheduler.TUNE_WINDOWS if nodes == small} == set(scheduler.TRACES)
