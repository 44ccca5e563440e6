"""Federated learning as a job type (pure): the spec's ``federated`` section and its checks.

A federated job is one trial whose gang is a Flower server (rank 0) and ``clients`` Flower
clients (ranks 1..N), placed together in one placement group. Rounds are the trial's steps. The
spec names the data set the clients share out: each client reads only its own partition,
computed deterministically from the data set and ``partition.seed`` (core/partition.py) and
materialised by the node for that client alone (docs/federated.md, ADR 0044).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core.errors import FieldError

MAX_CLIENTS = 4095  # with the server: resources.workers <= 4096
MAX_ROUNDS = 100_000
# the built-in data sets a federation may partition, and their sample counts (what is known at
# submit); any other name must be a tenant dataset listed in the spec's ``data``
BUILTIN_SIZES = {"digits": 1797}
# environment of every rank of a federated trial: the section as JSON (the runtime reads it)
FEDERATED_ENV = "TRAINHUB_FEDERATED"
# the folder of this client's partition (x.npy, y.npy, indices.npy), as the client sees it
PARTITION_ENV = "TRAINHUB_FEDERATED_PARTITION"
BUILTIN_PARTITION_MOUNT = "/data/partition"  # where a built-in set's partition is mounted


class JobKind(StrEnum):
    TRAINING = "training"  # the entrypoint on every rank (torch.distributed gang)
    FEDERATED = "federated"  # a Flower server and clients (the ``federated`` section)


class StrategyName(StrEnum):
    FEDAVG = "fedavg"
    FEDPROX = "fedprox"
    FEDADAM = "fedadam"


class PartitionScheme(StrEnum):
    DIRICHLET = "dirichlet"  # label skew: each class spread over clients by Dir(alpha)
    IID = "iid"  # a uniform random split into equal shares


class PartitionSpec(BaseModel):
    """How the data set is shared out among the clients."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dataset: str = Field(
        ...,
        min_length=1,
        max_length=200,
        description="A built-in set (digits) or the name of a tenant dataset listed in the "
        "spec's data (its x.npy and y.npy, or one .npz with x and y).",
    )
    scheme: PartitionScheme = Field(PartitionScheme.DIRICHLET, description="dirichlet | iid")
    alpha: Annotated[
        float,
        Field(
            gt=0,
            le=1e6,
            description="Concentration of the Dirichlet label skew: small (0.1) is very "
            "non-IID, large (100) nearly IID.",
        ),
    ] = 0.5
    seed: Annotated[int, Field(ge=0, le=2**31 - 1, description="Seed of the partition.")] = 0


class FederatedSpec(BaseModel):
    """The ``federated`` section: a Flower server and its clients as one trial."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    framework: Literal["flower"] = Field("flower", description="flower (flwr) is the one known.")
    clients: Annotated[
        int, Field(ge=1, le=MAX_CLIENTS, description="Client processes, one rank each.")
    ]
    rounds: Annotated[int, Field(ge=1, le=MAX_ROUNDS, description="Rounds: the trial's steps.")]
    strategy: StrategyName = Field(StrategyName.FEDAVG, description="fedavg | fedprox | fedadam")
    fraction_fit: Annotated[
        float, Field(gt=0, le=1, description="Share of the connected clients trained per round.")
    ] = 1.0
    fraction_evaluate: Annotated[
        float, Field(ge=0, le=1, description="Share of the clients evaluated per round.")
    ] = 1.0
    min_available_clients: Annotated[int, Field(ge=1, le=MAX_CLIENTS)] | None = Field(
        None,
        description="Clients that must be connected for a round to start; a round whose "
        "client dies completes with the others while this many remain (default: clients).",
    )
    proximal_mu: Annotated[
        float,
        Field(
            ge=0,
            le=1e6,
            description="FedProx's mu (the hyperparameter proximal_mu overrides it, so a "
            "search may vary it).",
        ),
    ] = 0.1
    server_learning_rate: Annotated[
        float, Field(gt=0, le=1e3, description="FedAdam's server step size (eta).")
    ] = 0.01
    round_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            le=86400,
            description="A client that has not answered a round after this long counts as "
            "failed for that round.",
        ),
    ] = 600.0
    rejoin_wait_s: Annotated[
        float,
        Field(
            ge=0,
            le=3600,
            description="After a round in which clients failed, how long the next round waits "
            "for them to be restarted and rejoin before it goes on with the others.",
        ),
    ] = 30.0
    partition: PartitionSpec

    @property
    def min_clients(self) -> int:
        return self.min_available_clients or self.clients


def federated_errors(
    kind: JobKind,
    federated: FederatedSpec | None,
    workers: int,
    workers_given: bool,
    data_names: list[str],
) -> list[FieldError]:
    """What a spec's ``kind``, ``federated`` and ``resources.workers`` say against each other.

    ``workers_given``: whether the spec wrote ``resources.workers`` (a federated trial has
    ``clients + 1`` ranks; the spec need not say so).
    """
    if kind != JobKind.FEDERATED:
        if federated is not None:
            return [
                FieldError(
                    "federated",
                    "a federated section needs kind: federated",
                    "add kind: federated, or remove the section",
                )
            ]
        return []
    if federated is None:
        return [
            FieldError(
                "federated",
                "kind: federated needs a federated section",
                "add federated: {clients: 4, rounds: 3, partition: {dataset: digits}}",
            )
        ]
    errors = []
    if workers_given and workers != federated.clients + 1:
        errors.append(
            FieldError(
                "resources.workers",
                f"a federation of {federated.clients} clients runs {federated.clients + 1} "
                f"ranks (the server and the clients), not {workers}",
                "leave resources.workers out: trainhub sets it from federated.clients",
            )
        )
    if federated.min_available_clients and federated.min_available_clients > federated.clients:
        errors.append(
            FieldError(
                "federated.min_available_clients",
                f"{federated.min_available_clients} is more than the {federated.clients} clients",
                f"use at most {federated.clients}",
            )
        )
    name = federated.partition.dataset
    size = BUILTIN_SIZES.get(name)
    if size is None and name not in data_names:
        known = ", ".join(sorted(BUILTIN_SIZES))
        errors.append(
            FieldError(
                "federated.partition.dataset",
                f"{name!r} is neither a built-in set ({known}) nor a dataset in data",
                f"list it in data (- {{name: {name}, mount: /data/{name.rsplit('/', 1)[-1]}}}) "
                "or use a built-in set",
            )
        )
    elif size is not None and size < federated.clients:
        errors.append(
            FieldError(
                "federated.partition",
                f"{name} has {size} samples: {federated.clients} clients leave "
                f"{federated.clients - size} of them with none",
                f"use at most {size} clients",
            )
        )
    return errors


def source_mount(dataset: str, data: list[tuple[str, str]]) -> str | None:
    """The mount path of the spec's ``data`` entry the partition reads, from (name, mount)
    pairs; a name pinned at submit (``TENANT/NAME``) matches the ``NAME`` the user wrote."""
    for name, mount in data:
        if name == dataset or ("/" not in dataset and name.rpartition("/")[2] == dataset):
            return mount
    return None


def launch_env(federated: dict[str, object], data: list[tuple[str, str]]) -> str:
    """``TRAINHUB_FEDERATED`` of every rank: the section, and where its data set is mounted."""
    partition = federated.get("partition")
    dataset = partition.get("dataset", "") if isinstance(partition, dict) else ""
    mount = source_mount(str(dataset), data) if dataset not in BUILTIN_SIZES else None
    return json.dumps({**federated, "source_mount": mount})


def launch_argv(entrypoint: list[str]) -> tuple[str, ...]:
    """Every rank runs trainhub's federation runner: the server on rank 0, and on the other
    ranks a supervisor of the user's client command (runtime/federated)."""
    return ("python", "-m", "trainhub.runtime.federated", *entrypoint)
