"""Entry points of the simulator: named traces, tenant guarantees, and runs of several policies.

Tenant guarantees for a trace are derived from demand: each tenant's guarantee is its share of
the trace's total GPU-time (``num_gpus x duration`` summed over its jobs) times the cluster's
GPUs, apportioned by largest remainder so that the guarantees add up to the cluster, with at
least one GPU for every tenant that submits anything. Fairness is then measured against those
guarantees (see ``trainhub.sim.metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trainhub.core.fairshare import apportion_guarantees
from trainhub.core.scheduling import (
    FairShareConfig,
    LasConfig,
    TenantShare,
    create_policy,
)
from trainhub.sim.cluster import ClusterSpec, load_openb_nodes, load_tiresias_cluster
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.metrics import SimResult
from trainhub.sim.trace import (
    TraceJob,
    load_openb_pods,
    load_philly,
    load_pollux_workload,
    load_tiresias,
)

TRACE_NAMES = (
    "philly",
    *(f"pollux-{i}" for i in range(1, 9)),
    "openb-default",
    "openb-gpushare100",
    "tiresias-60",
)


def default_traces_dir() -> Path:
    """``../shared/traces`` beside a source checkout of trainhub."""
    return Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: list[TraceJob]
    # the cluster the trace comes with, if it names one
    cluster: ClusterSpec | None = None


def load_trace(name: str, traces_dir: Path | None = None, limit: int | None = None) -> Trace:
    """A named trace (see ``TRACE_NAMES``) from ``traces_dir``, or a Philly-format CSV path."""
    root = Path(traces_dir) if traces_dir is not None else default_traces_dir()
    if name == "philly":
        return Trace(name, load_philly(root / "pollux-philly" / "philly.csv", limit))
    if name.startswith("pollux-"):
        path = root / "pollux-philly" / "workloads" / f"workload-{name.removeprefix('pollux-')}.csv"
        return Trace(name, _cut(load_pollux_workload(path), limit))
    if name.startswith("openb-"):
        base = root / "alibaba-openb-v2023"
        jobs = load_openb_pods(base / f"openb_pod_list_{name.removeprefix('openb-')}.csv", limit)
        return Trace(name, jobs, load_openb_nodes(base / "openb_node_list_gpu_node.csv"))
    if name == "tiresias-60":
        base = root / "tiresias"
        return Trace(
            name,
            _cut(load_tiresias(base / "60_job.csv"), limit),
            load_tiresias_cluster(base / "n32g4.csv"),
        )
    path = Path(name)
    if path.suffix == ".csv" and path.exists():
        return Trace(path.stem, load_philly(path, limit))
    choices = ", ".join(TRACE_NAMES)
    raise ValueError(f"unknown trace {name!r}; choose one of {choices} or a philly-format .csv")


def _cut(jobs: list[TraceJob], limit: int | None) -> list[TraceJob]:
    return jobs if limit is None else jobs[:limit]


def guarantees_from_demand(
    jobs: Sequence[TraceJob], total_gpus: int, min_slots: int = 1
) -> dict[str, TenantShare]:
    """Each tenant's guarantee in proportion to its share of the trace's GPU-time."""
    demand: dict[str, float] = {}
    for job in jobs:
        demand[job.tenant] = demand.get(job.tenant, 0.0) + job.num_gpus * job.duration_s
    shares = apportion_guarantees(demand, total_gpus, min_slots=min_slots)
    return {tenant: TenantShare(guaranteed_slots=slots) for tenant, slots in shares.items()}


def simulate(
    jobs: Sequence[TraceJob],
    cluster: ClusterSpec,
    policy: str,
    *,
    tenants: dict[str, TenantShare] | None = None,
    sim: SimConfig | None = None,
    fair: FairShareConfig | None = None,
    las: LasConfig | None = None,
) -> SimResult:
    """Run one policy by name. ``sjf`` sees the true durations (it is the bound); the others
    see them only if ``sim.known_durations``. Guarantees default to ``guarantees_from_demand``."""
    sim = sim or SimConfig()
    if fair is not None:
        # one half-life for the policy's score and the usage the simulator hands it
        sim = replace(sim, half_life_s=fair.half_life_s)
    if policy == "sjf" and not sim.known_durations:
        sim = replace(sim, known_durations=True)
    if tenants is None:
        tenants = guarantees_from_demand(jobs, cluster.total_gpus)
    chosen = create_policy(policy, fair=fair, las=las)
    return Simulator(jobs, cluster, chosen, tenants, sim).run()


def compare(
    jobs: Sequence[TraceJob],
    cluster: ClusterSpec,
    policies: Sequence[str],
    **options: object,
) -> list[SimResult]:
    """The same trace, cluster and guarantees under each policy, in order."""
    tenants = options.pop("tenants", None) or guarantees_from_demand(jobs, cluster.total_gpus)
    return [
        simulate(jobs, cluster, name, tenants=tenants, **options)  # type: ignore[arg-type]
        for name in policies
    ]


def ratios(result: dict[str, object], baseline: dict[str, object]) -> dict[str, float]:
    """``result`` over ``baseline`` for the headline metrics (lower is better for all)."""
    out: dict[str, float] = {}
    for key in (
        "avg_jct_s",
        "median_jct_s",
        "p99_jct_s",
        "avg_queueing_s",
        "p99_queueing_1gpu_s",
        "makespan_s",
    ):
        mine, base = result.get(key), baseline.get(key)
        if isinstance(mine, int | float) and isinstance(base, int | float) and base:
            out[key.removesuffix("_s") + "_vs_" + str(baseline.get("policy"))] = mine / base
    return out
