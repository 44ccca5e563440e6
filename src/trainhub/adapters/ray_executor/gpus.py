"""Which GPUs a rank sees: the torchrun convention on top of Ray's per-actor GPU ids.

Ray gives every rank actor its own GPUs and sets ``CUDA_VISIBLE_DEVICES`` to them alone, so
each rank sees one device, index 0. torchrun scripts instead expect every rank of a node to see
the node's GPUs and pick its own with ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``.
Like Ray Train, the executor shows every rank the union of its trial's GPUs on its node; the
order puts each rank's first GPU at index ``LOCAL_RANK`` (the rank's further GPUs, when it has
several, follow after all first GPUs), so that line picks the rank's own GPU. Pure: no Ray.

Example: two ranks of one node holding Ray GPUs ``["3"]`` and ``["1"]`` both see
``CUDA_VISIBLE_DEVICES=3,1``; LOCAL_RANK 0 uses cuda:0 (= GPU 3), LOCAL_RANK 1 uses cuda:1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuView:
    """What one rank is shown."""

    visible: tuple[str, ...]  # CUDA_VISIBLE_DEVICES, in order
    own: tuple[int, ...]  # indices into ``visible`` of this rank's own GPUs (first: LOCAL_RANK)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.visible)


def gpu_view(rank: int, nodes: Sequence[str], gpu_ids: Sequence[Sequence[str]]) -> GpuView:
    """The GPUs ``rank`` sees, given every rank's node and the GPU ids Ray gave each rank.

    Args:
        rank: the rank asking.
        nodes: node id of every rank (index = rank).
        gpu_ids: the GPU ids Ray assigned to every rank (index = rank); ranks without GPUs
            have an empty sequence.

    Raises:
        ValueError: when the inputs disagree (lengths, a GPU given to two ranks of one node).
    """
    if len(nodes) != len(gpu_ids):
        raise ValueError(f"{len(nodes)} nodes but {len(gpu_ids)} GPU lists")
    if not 0 <= rank < len(nodes):
        raise ValueError(f"rank {rank} outside 0..{len(nodes) - 1}")
    mine = nodes[rank]
    local = [r for r in range(len(nodes)) if nodes[r] == mine]  # in LOCAL_RANK order
    seen: set[str] = set()
    for r in local:
        for gpu in gpu_ids[r]:
            if gpu in seen:
                raise ValueError(f"GPU {gpu} of node {mine} given to two ranks")
            seen.add(gpu)
    if not gpu_ids[rank]:
        return GpuView((), ())
    firsts = [str(gpu_ids[r][0]) for r in local if gpu_ids[r]]
    rest = [str(g) for r in local for g in list(gpu_ids[r])[1:]]
    visible = tuple(firsts + rest)
    own = tuple(visible.index(str(g)) for g in gpu_ids[rank])
    return GpuView(visible, own)
