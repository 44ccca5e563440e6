"""/metrics (Prometheus) and the nodes routes, on a real database and a real app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.fixtures.api import Api, build_api, make_context
from trainhub.adapters.monitor.node_store import SqlNodeControlStore
from trainhub.api.app import create_app
from trainhub.core.resources import Node
from trainhub.service.monitoring import GpuSample, MonitoringService, NodeInventory, NodeSample

SPEC = "name: demo\nentrypoint: python train.py\n"
CONTEXT = make_context({"train.py": b"print('hi')\n"})


class StaticMonitor:
    def __init__(self, samples: list[NodeSample]) -> None:
        self.samples = samples

    def collect(self) -> list[NodeSample]:
        out, self.samples = self.samples, []
        return out

    def inventory(self) -> list[NodeInventory]:
        return [
            NodeInventory(
                node_id="n" * 20,
                hostname="gpu-a",
                cpu_model="EPYC",
                num_cores=64,
                memory_gb=512.0,
                gpus=({"model": "H100", "memory_gb": "80.0", "driver": "550", "uuid": "GPU-1"},),
                nics=({"name": "eth0", "speed_mbps": "100000", "address": "10.0.0.2"},),
            )
        ]


@pytest.fixture
def mapi(db_url: str, tmp_path: Path) -> Iterator[Api]:
    built = build_api(db_url, tmp_path)
    services = built.services
    node = "n" * 20
    services.cluster_nodes = lambda: [Node(node, 1, 64.0, 1, 64.0)]
    gpu = GpuSample(
        index=0,
        uuid="GPU-1",
        utilization_pct=97.0,
        memory_used_gb=40.0,
        memory_total_gb=80.0,
        temperature_c=71.0,
        power_w=350.0,
        trial_ids=(1,),
    )
    monitor = StaticMonitor(
        [NodeSample(node_id=node, at=services.clock(), cpu_pct=12.5, memory_used_gb=30.0,
                    memory_total_gb=512.0, gpus=(gpu,))]
    )  # fmt: skip
    engine = services.uow.engine  # type: ignore[attr-defined]
    services.monitoring = MonitoringService(monitor, SqlNodeControlStore(engine), services.clock)
    services.monitoring.refresh([node])
    built.client = TestClient(create_app(services))
    with built.client:
        yield built
    engine.dispose()


def test_metrics_need_an_admin_token(mapi: Api) -> None:
    assert mapi.client.get("/metrics").status_code == 401
    member = mapi.user("bob", "default")
    denied = mapi.client.get("/metrics", headers=mapi.headers(member))
    assert denied.status_code == 403
    assert denied.json()["code"] == "permission_denied"


def test_metrics_export_trials_queue_usage_gpus_and_latencies(mapi: Api) -> None:
    files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
    r = mapi.client.post(
        "/api/v1/experiments", data={"spec": SPEC}, files=files, headers=mapi.headers()
    )
    assert r.status_code == 201, r.text
    mapi.client.get("/api/v1/experiments", headers=mapi.headers())
    text = mapi.client.get("/metrics", headers=mapi.headers()).text
    assert 'trainhub_trials{state="queued",tenant="default"} 1.0' in text
    assert 'trainhub_queue_length{tenant="default"} 1.0' in text
    assert 'trainhub_tenant_slots_held{tenant="default"} 0.0' in text
    assert 'trainhub_tenant_slots_guaranteed{tenant="default"} 0.0' in text
    node = "n" * 20
    assert (
        f'trainhub_gpu_temperature_celsius{{gpu="0",node="{node}",tenant="default",trial="1",'
        'uuid="GPU-1"} 71.0'
    ) in text
    assert f'trainhub_node_healthy{{hostname="gpu-a",node="{node}"}} 1.0' in text
    assert (
        'trainhub_api_request_seconds_count{method="GET",route="/api/v1/experiments"} 1.0' in text
    )
    assert "trainhub_scheduling_decision_seconds_count 0.0" in text


def test_nodes_show_inventory_and_admins_cordon_drain_uncordon(mapi: Api) -> None:
    nodes = mapi.client.get("/api/v1/nodes", headers=mapi.headers()).json()["data"]
    assert len(nodes) == 1
    node = nodes[0]
    assert node["hostname"] == "gpu-a"
    assert node["gpu_inventory"][0]["model"] == "H100"
    assert node["nics"][0]["speed_mbps"] == "100000"
    assert node["gpus"][0]["temperature_c"] == 71.0
    assert node["schedulable"] is True
    member = mapi.user("bob", "default")
    assert (
        mapi.client.post("/api/v1/nodes/gpu-a/cordon", headers=mapi.headers(member)).status_code
        == 403
    )
    r = mapi.client.post(
        "/api/v1/nodes/gpu-a/drain", json={"reason": "new PSU"}, headers=mapi.headers()
    )
    assert r.status_code == 200, r.text
    assert (r.json()["cordoned"], r.json()["draining"], r.json()["schedulable"]) == (
        True,
        True,
        False,
    )
    assert mapi.services.monitoring is not None
    assert mapi.services.monitoring.draining_nodes() == {node["node_id"]}
    r = mapi.client.post("/api/v1/nodes/nnnnnnnn/uncordon", headers=mapi.headers())
    assert r.json()["schedulable"] is True
    missing = mapi.client.post("/api/v1/nodes/nowhere/cordon", headers=mapi.headers())
    assert missing.status_code == 404
    assert "trainhub nodes" in missing.json()["hint"]
    history = mapi.client.get("/api/v1/nodes/gpu-a/health", headers=mapi.headers()).json()
    assert history[0]["healthy"] is True
    series = mapi.client.get(
        "/api/v1/nodes/gpu-a/series",
        params={"metric": "gpu0.temperature_c"},
        headers=mapi.headers(),
    ).json()
    assert [v for _, v in series["points"]] == [71.0]


def test_every_metric_of_the_grafana_dashboard_is_exported(mapi: Api) -> None:
    import json
    import re

    dashboard = Path(__file__).parents[2] / "deploy" / "grafana" / "trainhub.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"trainhub_[a-z_]+", e)}
    assert len(names) >= 12
    text = mapi.client.get("/metrics", headers=mapi.headers()).text
    exported = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    for name in names:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert base in exported, name


def test_members_see_only_their_own_trials_on_gpus(mapi: Api) -> None:
    # the fixture's GPU runs trial 1, of tenant default
    files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
    r = mapi.client.post(
        "/api/v1/experiments", data={"spec": SPEC}, files=files, headers=mapi.headers()
    )
    assert r.json()["trial_ids"] == [1]
    outsider = mapi.user("eve", "other")
    insider = mapi.user("bob", "default")

    def trials_seen(token: str) -> list[int]:
        nodes = mapi.client.get("/api/v1/nodes", headers=mapi.headers(token)).json()["data"]
        return list(nodes[0]["gpus"][0]["trial_ids"])

    assert trials_seen(mapi.admin_token) == [1]
    assert trials_seen(insider) == [1]
    assert trials_seen(outsider) == []


def test_a_trial_shows_the_gpus_it_uses_to_whoever_may_see_it(mapi: Api) -> None:
    files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
    mapi.client.post(
        "/api/v1/experiments", data={"spec": SPEC}, files=files, headers=mapi.headers()
    )
    usage = mapi.client.get("/api/v1/trials/1/gpus", headers=mapi.headers()).json()
    assert usage["data"][0]["hostname"] == "gpu-a"
    assert [g["utilization_pct"] for g in usage["data"][0]["gpus"]] == [97.0]
    outsider = mapi.user("eve", "other")
    denied = mapi.client.get("/api/v1/trials/1/gpus", headers=mapi.headers(outsider))
    assert denied.status_code == 404


def test_network_bytes_are_a_counter_per_tenant_trial_direction_and_scope(mapi: Api) -> None:
    from trainhub.core.traffic import Scope, Source, TrafficDelta

    files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}
    r = mapi.client.post(
        "/api/v1/experiments", data={"spec": SPEC}, files=files, headers=mapi.headers()
    )
    assert r.status_code == 201, r.text
    with mapi.services.uow() as repo:
        attempt = repo.add_attempt(1, 1, "k1", ["n" * 20], None, None, mapi.services.clock())
        deltas = [
            TrafficDelta(attempt.id, 0, Scope.INTER, 5000, 7000, Source.KERNEL),
            TrafficDelta(attempt.id, 0, Scope.INTRA, 300, 300, Source.KERNEL),
        ]
        repo.add_traffic("2026-11-27", {attempt.id: 1}, deltas)
    text = mapi.client.get("/metrics", headers=mapi.headers()).text
    assert "# TYPE trainhub_network_bytes_total counter" in text
    for direction, scope, value in (
        ("sent", "inter-node", 5000),
        ("received", "inter-node", 7000),
        ("sent", "intra-node", 300),
    ):
        assert (
            f'trainhub_network_bytes_total{{direction="{direction}",scope="{scope}",'
            f'tenant="default",trial="1"}} {value}.0'
        ) in text


def test_admins_label_nodes_and_specs_name_the_levels(mapi: Api) -> None:
    services, monitoring = mapi.services, mapi.services.monitoring
    assert monitoring is not None
    # as server.py wires it: the submit check reads the nodes with their labels
    services.experiments.cluster_nodes = lambda: monitoring.labelled(services.cluster_nodes())
    member = mapi.user("bob", "default")
    body = {"labels": {"rack": "r3", "block": "b1"}}
    denied = mapi.client.post("/api/v1/nodes/gpu-a/labels", json=body, headers=mapi.headers(member))
    assert denied.status_code == 403
    bad = mapi.client.post(
        "/api/v1/nodes/gpu-a/labels", json={"labels": {"rack": "r 3"}}, headers=mapi.headers()
    )
    assert bad.status_code == 422
    r = mapi.client.post("/api/v1/nodes/gpu-a/labels", json=body, headers=mapi.headers())
    assert r.status_code == 200, r.text
    assert r.json()["labels"] == {"rack": "r3", "block": "b1"}
    files = {"context": ("context.tar.gz", CONTEXT, "application/gzip")}

    def submit(resources: str) -> object:
        spec = f"{SPEC}resources: {resources}\n"
        return mapi.client.post(
            "/api/v1/experiments", data={"spec": spec}, files=files, headers=mapi.headers()
        )

    ok = submit("{workers: 1, gpus_per_worker: 1, topology: {required: rack}}")
    assert ok.status_code == 201, ok.text  # type: ignore[attr-defined]
    # the one rack (one node of 1 GPU) can never hold two
    never = submit("{workers: 2, gpus_per_worker: 1, topology: {required: rack}}")
    assert never.status_code == 422  # type: ignore[attr-defined]
    assert "resources.topology.required" in never.text  # type: ignore[attr-defined]
    assert "largest rack (r3)" in never.text  # type: ignore[attr-defined]
    # nodes carry no block... they do here: unlabel it, then a block is no node's level
    mapi.client.post(
        "/api/v1/nodes/gpu-a/labels", json={"labels": {"block": ""}}, headers=mapi.headers()
    )
    none = submit("{workers: 1, gpus_per_worker: 1, topology: {preferred: block}}")
    assert none.status_code == 422  # type: ignore[attr-defined]
    assert "no node carries the level block" in none.text  # type: ignore[attr-defined]
    both = submit("{workers: 1, topology: {required: rack, preferred: rack}}")
    assert both.status_code == 422  # type: ignore[attr-defined]
    assert "resources.topology" in both.text  # type: ignore[attr-defined]
