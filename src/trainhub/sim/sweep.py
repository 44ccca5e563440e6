"""Sweep cells: a trace window at a chosen offered load on a cluster, and its result lines.

A *cell* is one trace, one cluster size and one load level. Its window is ``num_jobs``
consecutive jobs of the trace starting ``start_fraction`` of the way into it, with their
arrival times stretched or compressed by one factor so that the window's *offered load*
(:func:`offered_load`: the GPUs its jobs would hold on average while they arrive, per GPU of
the cluster) is the level asked for. Durations, sizes, tenants and the order of arrivals are
the trace's own; only the pace changes, so the same jobs are seen at 0.7x, 1x and 1.5x of the
cluster's capacity.

Each policy of a cell gives one line with the keys of :data:`LINE_KEYS`; ratios are against
FIFO measured in the same run on the same window. ``utilisation`` is the share of the GPUs
held while jobs arrive (the drain after the last arrival, when only the longest jobs are
left, says more about the trace than about the policy). FIFO *queues* in a cell when its jobs
wait at least :data:`QUEUEING_SHARE` of their completion time on average: no policy brings
the average completion time below the average run time, so "half of FIFO's" can only be
asked where FIFO's jobs spend at least half their time waiting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import cast

from trainhub.sim.trace import TraceJob

LINE_KEYS = (
    "cell",
    "split",
    "policy",
    "avg_jct_vs_fifo",
    "p99_jct_vs_fifo",
    "fifo_queues",
    "fifo_wait_share",
    "avg_jct_vs_las",
    "las_avg_jct_vs_fifo",
    "p99_slowdown_vs_fifo",
    "within_guarantee_jct_vs_fifo",
    "tenant_weighted_jct_vs_fifo",
    "min_share",
    "idle_while_fits",
    "utilisation",
    "preemptions_per_job",
    "wall_s",
)
QUEUEING_SHARE = 0.5
# where FIFO's waiting is at least this share of its average JCT, the fair policy's average
# JCT is held to LAS's (issue 27)
WAIT_SHARE_VS_LAS = 0.4


def offered_load(jobs: Sequence[TraceJob], total_gpus: int) -> float:
    """The GPUs the jobs would hold on average while they arrive, per GPU of the cluster.

    Each job counts from its arrival for its duration, cut at the last arrival: the mean
    occupancy of an unbounded cluster over the arrival span. Unlike "GPU-time over span",
    a few jobs that run for weeks (both traces have them) cannot make a window look loaded
    while it leaves most of the cluster idle.
    """
    if not jobs or total_gpus <= 0:
        return 0.0
    first = min(j.submit_s for j in jobs)
    last = max(j.submit_s for j in jobs)
    span = last - first
    if span <= 0:
        return math.inf
    held = sum(j.num_gpus * min(j.duration_s, last - j.submit_s) for j in jobs)
    return held / (span * total_gpus)


def load_window(
    jobs: Sequence[TraceJob],
    total_gpus: int,
    load: float,
    num_jobs: int,
    start_fraction: float = 0.4,
) -> list[TraceJob]:
    """Up to ``num_jobs`` consecutive jobs, arrivals rescaled to offer ``load`` x the cluster.

    The offered load falls as the arrivals are stretched, so one factor is found by
    bisection; a window too small to reach ``load`` even with all jobs arriving almost at
    once raises ValueError.
    """
    if not 0 <= start_fraction < 1:
        raise ValueError(f"start_fraction must be in [0, 1), got {start_fraction}")
    if load <= 0:
        raise ValueError(f"load must be > 0, got {load}")
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    # from start_fraction on, fewer than num_jobs where the trace ends first (openb has 6,203)
    first = int(len(ordered) * start_fraction)
    window = ordered[first : first + num_jobs]
    if len(window) < 2:
        raise ValueError("a window needs at least two jobs")
    start = window[0].submit_s

    def scaled(factor: float) -> list[TraceJob]:
        return [
            replace(j, job_id=i, submit_s=(j.submit_s - start) * factor)
            for i, j in enumerate(window)
        ]

    low, high = 1e-6, 1e6  # compress .. stretch; offered load falls as the factor grows
    if offered_load(scaled(low), total_gpus) < load:
        raise ValueError(
            f"{len(window)} jobs cannot offer {load}x of {total_gpus} GPUs; use a larger window"
        )
    for _ in range(100):
        middle = math.sqrt(low * high)
        if offered_load(scaled(middle), total_gpus) > load:
            low = middle
        else:
            high = middle
        if high / low < 1.0001:
            break
    return scaled(high)


def cell_name(trace: str, num_nodes: int, gpus_per_node: int, load: float | None) -> str:
    """``philly-48x8-load1.0``; ``-full`` where the trace runs at its own pace."""
    suffix = "full" if load is None else f"load{load:.1f}"
    return f"{trace}-{num_nodes}x{gpus_per_node}-{suffix}"


def _ratio(mine: object, base: object) -> float:
    if isinstance(mine, int | float) and isinstance(base, int | float) and base:
        return float(mine) / float(base)
    return math.nan


def _tenant_weighted(summary: Mapping[str, object], tenants: set[str]) -> float:
    """The mean over ``tenants`` of each one's average JCT."""
    per = summary.get("tenant_avg_jct_s")
    if not isinstance(per, Mapping):
        return math.nan
    values = [float(per[t]) for t in tenants if isinstance(per.get(t), int | float)]
    return sum(values) / len(values) if values else math.nan


def _worst_within_guarantee(mine: Mapping[str, object], fifo: Mapping[str, object]) -> float:
    """The highest ratio of a tenant's average JCT to its FIFO figure, over the tenants whose
    demand stayed within their guarantee in either run; nan where there is none."""
    sets = [s.get("within_guarantee") for s in (mine, fifo)]
    tenants = {t for found in sets if isinstance(found, list | tuple) for t in found}
    per, base = mine.get("tenant_avg_jct_s"), fifo.get("tenant_avg_jct_s")
    if not isinstance(per, Mapping) or not isinstance(base, Mapping):
        return math.nan
    ratios = [_ratio(per.get(t), base.get(t)) for t in tenants]
    ratios = [r for r in ratios if not math.isnan(r)]
    return max(ratios) if ratios else math.nan


def cell_lines(
    cell: str, summaries: Sequence[Mapping[str, object]], split: str | None = None
) -> list[dict[str, object]]:
    """One line per policy (keys :data:`LINE_KEYS`), ratios against the FIFO summary and,
    ``*_vs_las``, the LAS one (None where LAS did not run); ``split`` names the benchmark's
    split the cell belongs to (``tune`` or ``test``), None outside the benchmark."""
    fifo = next((s for s in summaries if s["policy"] == "fifo"), None)
    las = next((s for s in summaries if s["policy"] == "las"), None)
    queues = False
    wait_share = math.nan
    if fifo is not None:
        waited, took = fifo.get("avg_queueing_s"), fifo.get("avg_jct_s")
        if isinstance(waited, int | float) and isinstance(took, int | float) and took > 0:
            queues = waited >= QUEUEING_SHARE * took
            wait_share = float(waited) / float(took)
    tenants: set[str] = set()
    if fifo is not None and isinstance(fifo.get("tenant_avg_jct_s"), Mapping):
        tenants = set(cast("Mapping[str, object]", fifo["tenant_avg_jct_s"]))
    lines: list[dict[str, object]] = []
    for s in summaries:
        both = tenants & set(cast("Mapping[str, object]", s.get("tenant_avg_jct_s") or {}))
        lines.append(
            {
                "cell": cell,
                "split": split,
                "policy": s["policy"],
                "avg_jct_vs_fifo": _round(_ratio(s["avg_jct_s"], fifo and fifo["avg_jct_s"])),
                "p99_jct_vs_fifo": _round(_ratio(s["p99_jct_s"], fifo and fifo["p99_jct_s"])),
                "fifo_queues": queues,
                "fifo_wait_share": _round(wait_share),
                "avg_jct_vs_las": _round(_ratio(s["avg_jct_s"], las and las["avg_jct_s"])),
                "las_avg_jct_vs_fifo": _round(
                    _ratio(las and las["avg_jct_s"], fifo and fifo["avg_jct_s"])
                ),
                "p99_slowdown_vs_fifo": _round(
                    _ratio(s.get("p99_slowdown"), fifo and fifo.get("p99_slowdown"))
                ),
                "within_guarantee_jct_vs_fifo": _round(
                    _worst_within_guarantee(s, fifo) if fifo is not None else math.nan
                ),
                "tenant_weighted_jct_vs_fifo": _round(
                    _ratio(
                        _tenant_weighted(s, both),
                        _tenant_weighted(fifo, both) if fifo is not None else math.nan,
                    )
                ),
                "min_share": _round(s["fairness_min_ratio"]),
                "idle_while_fits": _round(s["idle_while_fits"]),
                "utilisation": _round(s["utilisation_while_arriving"]),
                "preemptions_per_job": _round(s["preemptions_per_job"]),
                "wall_s": _round(s["wall_s"], 2),
            }
        )
    return lines


def _round(value: object, digits: int = 4) -> object:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    return value


# -- topology cells (issue 30) -------------------------------------------------------------

TOPOLOGY_KEYS = (
    "cell",
    "policy",
    "single_rack_gangs",
    "best_fit_single_rack_gangs",
    "fragmentation",
    "best_fit_fragmentation",
    "avg_jct_vs_topology_blind",
    "wall_s",
)


def single_rack_rate(extra: Mapping[str, object]) -> float:
    """Of the gangs whose ideal span is one rack (more than a node, no more than a rack), the
    share placed in one rack (sim/network.py); nan where there was none."""
    spans = extra.get("spans")
    if not isinstance(spans, Mapping):
        return math.nan
    rack = [(k, int(v)) for k, v in spans.items() if str(k).startswith("rack->")]
    total = sum(v for _, v in rack)
    return sum(v for k, v in rack if k == "rack->rack") / total if total else math.nan


def topology_line(
    cell: str, aware: Mapping[str, object], blind: Mapping[str, object]
) -> dict[str, object]:
    """One line (keys :data:`TOPOLOGY_KEYS`): the topology-aware policy against the same
    policy placing by plain best fit (topology-blind), on the same jobs and cluster. The
    summaries carry ``extra`` (spans, fragmentation) as the simulator measured them."""
    a_extra = cast("Mapping[str, object]", aware.get("extra") or {})
    b_extra = cast("Mapping[str, object]", blind.get("extra") or {})
    return {
        "cell": cell,
        "policy": aware["policy"],
        "single_rack_gangs": _round(single_rack_rate(a_extra)),
        "best_fit_single_rack_gangs": _round(single_rack_rate(b_extra)),
        "fragmentation": _round(a_extra.get("fragmentation", math.nan)),
        "best_fit_fragmentation": _round(b_extra.get("fragmentation", math.nan)),
        "avg_jct_vs_topology_blind": _round(_ratio(aware["avg_jct_s"], blind["avg_jct_s"])),
        "wall_s": _round(float(cast(float, aware.get("wall_s", 0.0))), 2),
    }
