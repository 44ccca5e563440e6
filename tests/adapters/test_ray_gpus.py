"""The GPUs each rank sees (pure): torchrun's convention over Ray's per-rank GPU ids."""

from __future__ import annotations

import pytest

from trainhub.adapters.ray_executor.gpus import gpu_view


def views(nodes: list[str], ids: list[list[str]]) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for rank in range(len(nodes)):
        view = gpu_view(rank, nodes, ids)
        out.append((view.cuda_visible_devices, view.own))
    return out


def local_ranks(nodes: list[str]) -> list[int]:
    return [nodes[:r].count(nodes[r]) for r in range(len(nodes))]


def test_one_gpu_per_node_spread() -> None:
    nodes = ["a", "b", "c"]
    assert views(nodes, [["0"], ["0"], ["0"]]) == [("0", (0,)), ("0", (0,)), ("0", (0,))]


def test_two_gpus_per_node_pack() -> None:
    nodes = ["a", "a"]
    assert views(nodes, [["1"], ["0"]]) == [("1,0", (0,)), ("1,0", (1,))]


@pytest.mark.parametrize("placement", ["pack", "spread"])
def test_eight_gpus_per_node_local_rank_indexes_own_gpu(placement: str) -> None:
    if placement == "pack":  # 16 ranks on two full nodes
        nodes = ["a"] * 8 + ["b"] * 8
        ids = [[str(7 - i)] for i in range(8)] + [[str(i)] for i in range(8)]
    else:  # ranks alternate between the nodes (Ray's SPREAD)
        nodes = ["a", "b"] * 8
        ids = [[str(r // 2)] for r in range(16)]
    for rank, (visible, own) in enumerate(views(nodes, ids)):
        devices = visible.split(",")
        assert len(devices) == 8
        assert own == (local_ranks(nodes)[rank],)  # set_device(LOCAL_RANK) is its own GPU
        assert devices[own[0]] == ids[rank][0]


def test_two_trials_sharing_a_node_see_only_their_own_gpus() -> None:
    # trial A holds GPUs 0 and 5 of node n, trial B holds 2 and 3 of the same node
    a = views(["n", "n"], [["5"], ["0"]])
    b = views(["n", "n", "m"], [["2"], ["3"], ["0"]])
    assert a == [("5,0", (0,)), ("5,0", (1,))]
    assert b == [("2,3", (0,)), ("2,3", (1,)), ("0", (0,))]
    assert not set(a[0][0].split(",")) & set(b[0][0].split(","))


def test_several_gpus_per_rank_first_gpus_lead() -> None:
    view0 = gpu_view(0, ["a", "a"], [["0", "1"], ["2", "3"]])
    view1 = gpu_view(1, ["a", "a"], [["0", "1"], ["2", "3"]])
    assert view0.visible == view1.visible == ("0", "2", "1", "3")
    assert view0.own == (0, 2)
    assert view1.own == (1, 3)


def test_cpu_ranks_see_no_gpu() -> None:
    assert gpu_view(1, ["a", "a"], [[], []]).cuda_visible_devices == ""


def test_inconsistent_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="two ranks"):
        gpu_view(0, ["a", "a"], [["0"], ["0"]])
    with pytest.raises(ValueError, match="GPU lists"):
        gpu_view(0, ["a"], [])
