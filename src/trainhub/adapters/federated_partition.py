"""A federated client's partition, materialised on its node before the client starts.

The node agent (the rank's actor, outside the sandbox) reads the federation's data set (a
built-in set, or the tenant dataset the node's cache holds), computes the whole partition
(core/partition.py: deterministic from the labels and the seed) and writes only its own
client's share into a folder of that rank (``x.npy``, ``y.npy``, ``indices.npy``). The
sandbox binds that folder alone, read-only, where the data set would be mounted: the client
cannot read another client's share, nor the whole set (ADR 0044).

numpy only (and sklearn for the built-in digits), imported lazily by the rank actor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainhub.core.federated_spec import BUILTIN_SIZES
from trainhub.core.partition import partition_indices


class PartitionError(Exception):
    """The data set cannot be shared out as the spec asks (said in the rank's log)."""


def load_source(
    dataset: str, folder: Path | None
) -> tuple[npt.NDArray[Any], npt.NDArray[np.integer]]:
    """(x, y) of the federation's data set: a built-in set, or a tenant dataset's folder
    holding ``x.npy`` and ``y.npy`` or one ``.npz`` with ``x`` and ``y``."""
    if dataset in BUILTIN_SIZES:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images.reshape(-1, 1, 8, 8).astype(np.float32), bunch.target
    if folder is None:
        raise PartitionError(f"dataset {dataset} is not mounted on this node")
    if (folder / "x.npy").is_file() and (folder / "y.npy").is_file():
        return np.load(folder / "x.npy"), np.load(folder / "y.npy")
    archives = sorted(folder.glob("*.npz"))
    if len(archives) == 1:
        with np.load(archives[0]) as data:
            if "x" in data and "y" in data:
                return data["x"], data["y"]
    raise PartitionError(
        f"dataset {dataset} holds no x.npy and y.npy (nor one .npz with x and y): a "
        "federation partitions labelled tensors"
    )


def materialise(
    federated: dict[str, Any], client: int, source: Path | None, target: Path
) -> dict[str, int]:
    """Write client ``client``'s share into ``target``; what it holds, per class."""
    part = federated["partition"]
    x, y = load_source(part["dataset"], source)
    if len(x) != len(y):
        raise PartitionError(f"x has {len(x)} samples and y {len(y)}")
    clients = int(federated["clients"])
    try:
        shares = partition_indices(
            y,
            clients,
            scheme=part.get("scheme", "dirichlet"),
            alpha=float(part.get("alpha", 0.5)),
            seed=int(part.get("seed", 0)),
        )
    except ValueError as exc:
        raise PartitionError(f"federated.partition: {exc}") from None
    mine = shares[client]
    target.mkdir(parents=True, exist_ok=True)
    np.save(target / "x.npy", x[mine])
    np.save(target / "y.npy", y[mine])
    np.save(target / "indices.npy", mine)
    classes, counts = np.unique(y[mine], return_counts=True)
    held = {str(int(c)): int(n) for c, n in zip(classes, counts, strict=True)}
    (target / "partition.json").write_text(
        json.dumps({"client": client, "clients": clients, "samples": len(mine), "labels": held})
    )
    for path in target.iterdir():
        path.chmod(0o444)
    return held
