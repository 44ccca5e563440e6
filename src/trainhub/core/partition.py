"""Sharing a labelled data set out among federated clients (pure, numpy only).

:func:`partition_indices` is deterministic: the same labels, scheme, alpha, client count and
seed give the same partition on every node, so each client's node computes the whole partition
and keeps only its client's share. No client is left empty when there are at least as many
samples as clients: a Dirichlet draw that leaves one empty is drawn again (up to
``_REDRAWS`` times), then the largest shares give one sample each to the empty ones.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_REDRAWS = 10


def partition_indices(
    labels: npt.NDArray[np.integer],
    clients: int,
    *,
    scheme: str = "dirichlet",
    alpha: float = 0.5,
    seed: int = 0,
) -> list[npt.NDArray[np.int64]]:
    """The sample indices of each client (sorted), ``clients`` arrays covering every sample
    exactly once.

    ``dirichlet``: for each class, its samples are split among the clients in proportions drawn
    from Dir(alpha) (small alpha: each client sees few classes). ``iid``: a random permutation
    cut into near-equal shares.
    """
    labels = np.asarray(labels).reshape(-1)
    n = len(labels)
    if clients < 1:
        raise ValueError("clients must be at least 1")
    if n < clients:
        raise ValueError(f"{n} samples cannot give each of {clients} clients one")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        order = rng.permutation(n)
        return [np.sort(part).astype(np.int64) for part in np.array_split(order, clients)]
    if scheme != "dirichlet":
        raise ValueError(f"unknown partition scheme {scheme!r}")
    parts: list[list[int]] = []
    for _ in range(_REDRAWS):
        parts = _dirichlet_draw(labels, clients, alpha, rng)
        if all(parts):
            break
    _fill_empty(parts)
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


def _dirichlet_draw(
    labels: npt.NDArray[np.integer], clients: int, alpha: float, rng: np.random.Generator
) -> list[list[int]]:
    parts: list[list[int]] = [[] for _ in range(clients)]
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        shares = rng.dirichlet(np.full(clients, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for client, chunk in enumerate(np.split(members, cuts)):
            parts[client].extend(int(i) for i in chunk)
    return parts


def _fill_empty(parts: list[list[int]]) -> None:
    """Give each empty share one sample of the largest share (deterministic)."""
    for client, part in enumerate(parts):
        if part:
            continue
        donor = max(range(len(parts)), key=lambda c: (len(parts[c]), -c))
        parts[donor].sort()
        part.append(parts[donor].pop())
        assert parts[donor], "a donor keeps at least one sample when n >= clients"
        parts[client] = part


def split_local(size: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A client's own train/validation split of its ``size`` samples (positions), at least
    one training sample; validation gets none when the share is a single sample."""
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(size)]
    val = min(round(size * val_fraction), size - 1)
    return sorted(order[val:]), sorted(order[:val])
