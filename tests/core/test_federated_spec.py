"""The ``federated`` section of a spec and the partition of a data set among clients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainhub.core.errors import InvalidSpec
from trainhub.core.federated_spec import launch_argv, launch_env, source_mount
from trainhub.core.partition import partition_indices
from trainhub.core.resources import Node
from trainhub.core.spec import parse_spec
from trainhub.service.experiments import check_fits_cluster

SPEC = """
name: fl
kind: federated
entrypoint: python client.py
federated:
  clients: 4
  rounds: 3
  strategy: {strategy}
  min_available_clients: {minimum}
  partition: {{dataset: {dataset}, scheme: dirichlet, alpha: 0.3}}
{extra}
"""


def spec_text(
    strategy: str = "fedavg", minimum: int = 3, dataset: str = "digits", extra: str = ""
) -> str:
    return SPEC.format(strategy=strategy, minimum=minimum, dataset=dataset, extra=extra)


def paths(text: str) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(text)
    return {e.path: e.message for e in caught.value.errors}


def test_a_federation_runs_the_server_and_its_clients_as_one_gang() -> None:
    spec = parse_spec(spec_text())
    assert spec.federated is not None
    assert spec.resources.workers == 5
    assert spec.federated.min_clients == 3
    # the stored spec validates again the same (a restart, a clone)
    again = parse_spec(spec_text(extra="resources: {workers: 5}"))
    assert again.resources.workers == 5


def test_an_unknown_strategy_is_refused_naming_the_field() -> None:
    errors = paths(spec_text(strategy="fedsgd"))
    assert "federated.strategy" in errors
    assert "'fedsgd' is not allowed" in errors["federated.strategy"]


def test_more_min_available_clients_than_clients_is_refused() -> None:
    errors = paths(spec_text(minimum=5))
    assert errors == {"federated.min_available_clients": "5 is more than the 4 clients"}


def test_a_partition_that_leaves_clients_empty_is_refused_at_submit() -> None:
    text = (
        spec_text()
        .replace("clients: 4", "clients: 1800")
        .replace("min_available_clients: 3", "min_available_clients: 2")
    )
    errors = paths(text)
    assert "federated.partition" in errors
    assert "1797 samples" in errors["federated.partition"]


def test_a_dataset_neither_built_in_nor_mounted_is_refused() -> None:
    errors = paths(spec_text(dataset="hospital"))
    assert "federated.partition.dataset" in errors
    mounted = spec_text(dataset="hospital", extra="data: [{name: hospital, mount: /data/h}]")
    assert parse_spec(mounted).federated is not None


def test_kind_and_section_go_together_and_workers_must_match() -> None:
    assert "federated" in paths(spec_text().replace("kind: federated\n", ""))
    assert "federated" in paths("name: x\nkind: federated\nentrypoint: python c.py\n")
    errors = paths(spec_text(extra="resources: {workers: 2}"))
    assert "resources.workers" in errors


def test_clients_that_do_not_fit_the_cluster_name_federated_clients() -> None:
    spec = parse_spec(spec_text(extra="resources: {cpus_per_worker: 1}"))
    node = Node("n1", total_gpus=0, total_cpus=2, free_gpus=0, free_cpus=2)
    with pytest.raises(InvalidSpec) as caught:
        check_fits_cluster(spec.resources, [node], spec.federated)
    (error,) = caught.value.errors
    assert error.path == "federated.clients"
    assert "4 clients and the server need 5" in error.message


def test_the_launch_finds_the_pinned_dataset_and_wraps_the_entrypoint() -> None:
    section = {"clients": 2, "partition": {"dataset": "hospital"}}
    env = launch_env(section, [("teama/hospital", "/data/h")])
    assert '"source_mount": "/data/h"' in env
    assert source_mount("other/hospital", [("teama/hospital", "/data/h")]) is None
    assert launch_argv(["python", "c.py"])[:3] == ("python", "-m", "trainhub.runtime.federated")


def test_partitions_are_deterministic_disjoint_and_never_empty() -> None:
    labels = np.repeat(np.arange(10), 30)
    first = partition_indices(labels, 8, alpha=0.05, seed=3)
    again = partition_indices(labels, 8, alpha=0.05, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    joined = np.concatenate(first)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    assert all(len(p) > 0 for p in first)
    # alpha 0.05 is strongly non-IID: most clients see few classes
    classes = [len(set(labels[p].tolist())) for p in first]
    assert np.median(classes) <= 4, classes
    other = partition_indices(labels, 8, alpha=0.05, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    iid = partition_indices(labels, 8, scheme="iid", seed=0)
    assert {len(p) for p in iid} <= {37, 38}
    tiny = partition_indices(np.zeros(5, dtype=int), 5, alpha=0.01, seed=0)
    assert [len(p) for p in tiny] == [1, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="cannot give each"):
        partition_indices(np.zeros(3, dtype=int), 4)


@pytest.mark.parametrize("name", ["experiment.yaml", "search.yaml"])
def test_the_examples_are_valid_specs(name: str) -> None:
    path = Path(__file__).parents[2] / "examples" / "federated" / name
    spec = parse_spec(path.read_text())
    assert spec.federated is not None
    assert spec.resources.workers == spec.federated.clients + 1
    if name == "search.yaml":  # a search whose trials are federations
        assert spec.searcher.kind != "single"
        names = {p.name for p in spec.search_space.walk()}
        assert names >= {"lr", "local_epochs", "proximal_mu"}
