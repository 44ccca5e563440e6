"""FIFO with gang semantics and reasons, on plain values."""

from __future__ import annotations

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import FifoPolicy, Pending, QueuedTrial, Snapshot, Start
from trainhub.core.spec import Placement


def node(name: str, gpus: int, free_gpus: int | None = None, cpus: float = 32) -> Node:
    return Node(name, gpus, cpus, gpus if free_gpus is None else free_gpus, cpus)


def queued(trial_id: int, workers: int, gpus: int = 1, **kw: object) -> QueuedTrial:
    return QueuedTrial(
        trial_id,
        "t",
        ResourceRequest(workers, gpus_per_worker=gpus, **kw),  # type: ignore[arg-type]
        submitted_at=float(trial_id),
    )


def decide(nodes: list[Node], queue: list[QueuedTrial]) -> dict[int, Start | Pending]:
    decisions = FifoPolicy().decide(Snapshot(0.0, tuple(nodes), tuple(queue)))
    assert len(decisions) == len(queue), "every queued trial gets exactly one decision"
    return {d.trial_id: d for d in decisions}  # type: ignore[misc]


def test_starts_in_order_while_it_fits_and_never_splits_a_gang() -> None:
    out = decide([node("a", 4), node("b", 4)], [queued(1, 4), queued(2, 3), queued(3, 2)])
    assert isinstance(out[1], Start)
    assert len(out[1].placement) == 4
    assert isinstance(out[2], Start)
    # 1 GPU left: trial 3 needs 2 -> no partial gang
    assert isinstance(out[3], Pending)
    assert "needs 2 worker(s) x 1 GPU" in out[3].reason


def test_head_of_line_blocks_those_behind_with_a_reason() -> None:
    out = decide([node("a", 4, free_gpus=2)], [queued(1, 4), queued(2, 1)])
    assert isinstance(out[1], Pending)
    assert "waiting for resources" in out[1].reason
    assert isinstance(out[2], Pending)
    assert out[2].reason == "waiting behind trial 1 (FIFO order)"


def test_a_request_that_can_never_fit_says_so_and_does_not_block() -> None:
    out = decide([node("a", 8), node("b", 8)], [queued(1, 20), queued(2, 2)])
    assert isinstance(out[1], Pending)
    assert out[1].reason.startswith("can never run")
    assert isinstance(out[2], Start)


def test_gpu_request_on_a_cpu_cluster() -> None:
    out = decide([node("a", 0)], [queued(1, 1)])
    assert isinstance(out[1], Pending)
    assert "no GPUs" in out[1].reason
    assert "gpus_per_worker: 0" in out[1].reason


def test_single_node_reason_names_largest_node() -> None:
    out = decide([node("a", 8), node("b", 8)], [queued(1, 16, single_node=True)])
    assert isinstance(out[1], Pending)
    assert "largest node holds 8" in out[1].reason


def test_pack_uses_fewest_nodes_and_spread_uses_many() -> None:
    nodes = [node("a", 4), node("b", 4), node("c", 4)]
    packed = decide(nodes, [queued(1, 4)])[1]
    spread = decide(nodes, [queued(1, 3, placement=Placement.SPREAD)])[1]
    assert isinstance(packed, Start)
    assert set(packed.placement) == {"a"}
    assert isinstance(spread, Start)
    assert len(set(spread.placement)) == 3


def test_cpu_only_trials_count_cpus() -> None:
    nodes = [Node("a", 0, 2, 0, 2)]
    out = decide(nodes, [queued(1, 2, gpus=0), queued(2, 1, gpus=0)])
    assert isinstance(out[1], Start)
    assert out[1].placement == ("a", "a")
    assert isinstance(out[2], Pending)
