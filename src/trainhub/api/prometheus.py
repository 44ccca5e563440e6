"""The Prometheus exposition of a control plane: built at scrape time from the services.

One collector reads the database (live trials, queue, tenant usage) and the monitoring service
(latest node samples, latency histograms); nothing is kept in prometheus-client's global
registry, so several control planes in one process (tests) do not mix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from trainhub.service.container import Services
from trainhub.service.monitoring import LatencyHistogram, NodeStatus, gather_cluster_metrics


def _histogram(
    name: str, doc: str, labels: list[str], series: Mapping[tuple[str, ...], LatencyHistogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, histogram in series.items():
        family.add_metric(list(values), histogram.cumulative(), histogram.total_s)
    return family


class ControlPlaneCollector(Collector):
    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        services = self.services
        facts = gather_cluster_metrics(services.uow, services.clock())
        trials = GaugeMetricFamily(
            "trainhub_trials", "Live trials by tenant and state", labels=["tenant", "state"]
        )
        for (tenant, state), n in sorted(facts.trials_by_state.items()):
            trials.add_metric([tenant, state], n)
        yield trials
        queue = GaugeMetricFamily("trainhub_queue_length", "Queued trials", labels=["tenant"])
        wait = GaugeMetricFamily(
            "trainhub_queue_oldest_wait_seconds",
            "How long the longest-waiting queued trial has waited",
            labels=["tenant"],
        )
        for tenant, n in sorted(facts.queue_length.items()):
            queue.add_metric([tenant], n)
            wait.add_metric([tenant], facts.oldest_wait_s.get(tenant, 0.0))
        yield queue
        yield wait
        held = GaugeMetricFamily(
            "trainhub_tenant_slots_held", "Slots the tenant's trials hold now", labels=["tenant"]
        )
        guaranteed = GaugeMetricFamily(
            "trainhub_tenant_slots_guaranteed", "The tenant's guaranteed slots", labels=["tenant"]
        )
        for tenant in sorted({*facts.held_slots, *facts.guaranteed_slots}):
            held.add_metric([tenant], facts.held_slots.get(tenant, 0))
            guaranteed.add_metric([tenant], facts.guaranteed_slots.get(tenant, 0))
        yield held
        yield guaranteed
        yield self._network()
        monitoring = services.monitoring
        if monitoring is None:
            return
        yield _histogram(
            "trainhub_scheduling_decision_seconds",
            "Time the scheduling policy took per pass",
            [],
            {(): monitoring.decision_latency},
        )
        yield _histogram(
            "trainhub_api_request_seconds",
            "API request latency by method and route",
            ["method", "route"],
            monitoring.api_latency,
        )
        yield from self._nodes(monitoring.nodes(), facts.trial_tenants)

    def _network(self) -> Metric:
        """Bytes each trial's ranks sent and received, per scope (docs/adr/0045)."""
        family = CounterMetricFamily(
            "trainhub_network_bytes",
            "Network bytes a trial's ranks sent and received, inter-node or intra-node",
            labels=["tenant", "trial", "direction", "scope"],
        )
        with self.services.uow() as repo:
            rows = repo.traffic_by_trial()
        for tenant, trial_id, scope, sent, received in rows:
            family.add_metric([tenant, str(trial_id), "sent", scope], sent)
            family.add_metric([tenant, str(trial_id), "received", scope], received)
        return family

    @staticmethod
    def _nodes(nodes: Sequence[NodeStatus], trial_tenants: Mapping[int, str]) -> Iterator[Metric]:
        node_labels = ["node", "hostname"]
        healthy = GaugeMetricFamily("trainhub_node_healthy", "1 when healthy", labels=node_labels)
        schedulable = GaugeMetricFamily(
            "trainhub_node_schedulable", "1 when it takes new trials", labels=node_labels
        )
        cpu = GaugeMetricFamily("trainhub_node_cpu_percent", "CPU use", labels=node_labels)
        mem = GaugeMetricFamily("trainhub_node_memory_used_gb", "Memory used", labels=node_labels)
        gpu_labels = ["node", "gpu", "uuid", "tenant", "trial"]
        gpu_families = {
            "utilization_pct": GaugeMetricFamily(
                "trainhub_gpu_utilization_percent", "GPU utilisation", labels=gpu_labels
            ),
            "memory_used_gb": GaugeMetricFamily(
                "trainhub_gpu_memory_used_gb", "GPU memory used", labels=gpu_labels
            ),
            "temperature_c": GaugeMetricFamily(
                "trainhub_gpu_temperature_celsius", "GPU temperature", labels=gpu_labels
            ),
            "power_w": GaugeMetricFamily(
                "trainhub_gpu_power_watts", "GPU power", labels=gpu_labels
            ),
            "ecc_uncorrected": GaugeMetricFamily(
                "trainhub_gpu_ecc_uncorrected_errors",
                "Volatile uncorrected ECC errors",
                labels=gpu_labels,
            ),
        }
        for status in nodes:
            host = status.inventory.hostname if status.inventory else ""
            labels = [status.node_id, host]
            healthy.add_metric(labels, float(status.health.healthy))
            schedulable.add_metric(labels, float(status.schedulable))
            if status.latest is None:
                continue
            cpu.add_metric(labels, status.latest.cpu_pct)
            mem.add_metric(labels, status.latest.memory_used_gb)
            for gpu in status.latest.gpus:
                trial = ",".join(str(t) for t in gpu.trial_ids)
                tenant = ",".join(sorted({trial_tenants.get(t, "") for t in gpu.trial_ids}))
                values = [status.node_id, str(gpu.index), gpu.uuid, tenant, trial]
                for name, family in gpu_families.items():
                    value = getattr(gpu, name)
                    if value is not None:
                        family.add_metric(values, float(value))
        yield from (healthy, schedulable, cpu, mem, *gpu_families.values())


def exposition(services: Services) -> tuple[bytes, str]:
    """The text format Prometheus scrapes, and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlPlaneCollector(services))
    return generate_latest(registry), CONTENT_TYPE_LATEST
