"""Model parallelism as the control plane sees it: can a tensor-parallel group share a node?

Tensor-parallel ranks exchange activations in every layer, so a trial's tensor groups must each
fit on one node (pipeline stages may span nodes). This module judges that at submit, against
each node's total capacity; where the ranks are placed is the scheduler's business.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainhub.core.resources import Node, ResourceRequest, Unfittable


def tensor_group_unfittable(
    request: ResourceRequest, tensor: int, nodes: Iterable[Node]
) -> Unfittable | None:
    """Why no node can hold ``tensor`` ranks of ``request`` (the tensor-parallel group); None
    when one can or when ``tensor`` is 1. With no alive node nothing is judged."""
    if tensor <= 1:
        return None
    rooms = [n.fits(request, free=False) for n in nodes if n.alive]
    if not rooms or max(rooms) >= tensor:
        return None
    return Unfittable(
        "distributed.tensor",
        f"a tensor-parallel group of {tensor} ranks must share one node, and a node holds at "
        f"most {max(rooms)} worker(s) of {request.describe()}",
    )
