"""The torch.distributed process group of a trial, set up from torchrun's variables.

The executor (or torchrun) sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``;
``init_process_group`` with ``env://`` rendezvouses on them. Collectives are torch's (gloo on
CPU, NCCL on GPU); nothing here moves tensors itself.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store, TCPStore  # type: ignore[attr-defined]

logger = logging.getLogger("trainhub.runtime")
# the attempt's rendezvous secret the executor sets (core/isolation.py RENDEZVOUS_SECRET_ENV;
# tests/runtime/test_process_group_secret.py keeps the two equal)
RENDEZVOUS_SECRET_ENV = "TRAINHUB_RENDEZVOUS_SECRET"


def select_device(local_rank: int, local_world_size: int) -> torch.device:
    """The device of this rank: its GPU when it has one, else the CPU.

    torchrun and the trainhub executor agree: the ranks of a node see the node's (trial's) GPUs
    and rank ``LOCAL_RANK`` uses index ``LOCAL_RANK``; a rank started alone with a single
    visible GPU (Ray's per-actor ``CUDA_VISIBLE_DEVICES``) uses index 0.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank < count:
        return torch.device("cuda", local_rank)
    if count == 1:
        return torch.device("cuda", 0)
    logger.warning(
        "trainhub: LOCAL_RANK=%d but only %d GPUs are visible; ranks will share GPUs",
        local_rank,
        count,
    )
    return torch.device("cuda", local_rank % count)


def backend_for(device: torch.device) -> str:
    """NCCL for GPU ranks, gloo for CPU ranks."""
    return "nccl" if device.type == "cuda" else "gloo"


def ensure_process_group(*, rank: int, world_size: int, device: torch.device) -> bool:
    """Join the trial's process group unless the script already did; True if this call did.

    Backend: NCCL when this rank has a GPU, gloo otherwise. Every rank must call it: it blocks
    until all ``world_size`` ranks have joined.
    """
    if world_size <= 1 or dist.is_initialized():
        return False
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={world_size} but {' and '.join(missing)} unset: launch with torchrun "
            "(or the trainhub executor), which sets the rendezvous address"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = backend_for(device)
    secret = os.environ.get(RENDEZVOUS_SECRET_ENV)
    if not secret:
        dist.init_process_group(
            backend=backend, init_method="env://", rank=rank, world_size=world_size
        )
        return True
    dist.init_process_group(
        backend=backend,
        store=rendezvous_store(rank, world_size, secret),
        rank=rank,
        world_size=world_size,
    )
    return True


def rendezvous_store(rank: int, world_size: int, secret: str) -> Store:
    """The trial's store on rank 0's ``MASTER_ADDR:MASTER_PORT``, its keys under ``secret``.

    A process of another trial that reaches the port can neither read nor write the trial's
    rendezvous keys (it cannot name them) and cannot pass as one of its ranks.
    """
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0,
        wait_for_workers=False,
    )
    return PrefixStore(f"trainhub/{secret}/", store)


def _collective_device(device: torch.device) -> torch.device:
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def agree_on_stop(
    local_stop: bool, local_reason: str | None, device: torch.device
) -> tuple[bool, str | None]:
    """Stop everywhere if any rank wants to stop; a collective every rank must enter.

    Returns the common decision and the reason of the lowest rank that wanted to stop.
    """
    flag = torch.tensor(
        [1 if local_stop else 0], dtype=torch.int32, device=_collective_device(device)
    )
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if int(flag.item()) == 0:
        return False, None
    # rare (once per trial): share the reason string too
    reasons: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, local_reason if local_stop else None)
    return True, next((reason for reason in reasons if reason), None)
