"""Issue 28: pipeline and tensor parallelism on real gloo ranks (forked processes) against one
process training the same tiny transformer on the same data: every layout's loss within 1e-5
for 5 steps, and a checkpoint of one layout resumed on another."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed import launch
from tests.distributed import model_parallel_ranks as ranks
from trainhub import models
from trainhub.runtime.distributed.parallel import (
    check_plan,
    keep_stage,
    one_f_one_b_bubble,
    stage_bounds,
)
from trainhub.runtime.errors import SpecRefused

# the fork server imports these once for every rank (seconds each on a loaded machine)
for _module in ("torch.distributed.pipelining", "torch.distributed.tensor.parallel", "trainhub"):
    if _module not in launch.PRELOAD:
        launch.PRELOAD.append(_module)

TOLERANCE = 1e-5
LAYOUTS = [
    {"pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b"}, "tensor": 2},
    {"pipeline": {"stages": 2, "microbatches": 2, "schedule": "gpipe"}},  # dp2 x pp2
    {"pipeline": {"stages": 4, "microbatches": 4, "schedule": "1f1b"}},
    {"tensor": 2},  # dp2 x tp2
    {"tensor": 4},
]


def test_every_layout_trains_as_one_process_does() -> None:
    reference = ranks.reference_losses()
    results = launch.run_ranks(ranks.train_layouts, LAYOUTS, world_size=4)
    for index, section in enumerate(LAYOUTS):
        for rank, per_layout in enumerate(results):
            got = per_layout[index]
            worst = max(abs(a - b) for a, b in zip(got["losses"], reference, strict=True))
            assert worst <= TOLERANCE, (section, got["layout"], rank, got["losses"], reference)
    layouts = [r["layout"] for r in results[0]]
    assert layouts == [
        "dp1 x pp2 x tp2",
        "dp2 x pp2 x tp1",
        "dp1 x pp4 x tp1",
        "dp2 x pp1 x tp2",
        "dp1 x pp1 x tp4",
    ]
    pipelined = results[0][1]["times"]
    tensor_only = results[0][4]["times"]
    assert 0 < pipelined["time/bubble_share"] < 1
    assert pipelined["time/tp_comm_share"] == 0
    assert 0 < tensor_only["time/tp_comm_share"] < 1


def test_a_pp2_tp2_checkpoint_resumes_on_pp4(tmp_path: Path) -> None:
    reference = ranks.reference_losses()
    first = {"pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b"}, "tensor": 2}
    second = {"pipeline": {"stages": 4, "microbatches": 4, "schedule": "gpipe"}}
    results = launch.run_ranks(ranks.save_then_restore, first, second, str(tmp_path), world_size=4)
    for result in results:
        assert sorted(result["before"]) == [0, 1, 2]
        assert sorted(result["after"]) == [3, 4]  # resumed after the checkpoint's step
        for step, loss in {**result["before"], **result["after"]}.items():
            assert abs(loss - reference[step]) <= TOLERANCE, (step, loss, reference[step])


def test_the_1f1b_bubble_with_free_transfers_is_the_textbook_bound_for_equal_stages() -> None:
    # (p - 1) / (m + p - 1) on every stage
    assert one_f_one_b_bubble([(1.0, 2.0)] * 2, 8) == pytest.approx([1 / 9, 1 / 9])
    assert one_f_one_b_bubble([(1.0, 2.0)] * 4, 8) == pytest.approx([3 / 11] * 4)
    assert one_f_one_b_bubble([(1.0, 2.0)], 8) == pytest.approx([0.0])
    # a slower last stage sets the pace: the first waits on it, the last barely idles
    first, last = one_f_one_b_bubble([(1.0, 2.0), (1.5, 3.0)], 8)
    assert last < 1 / 9 < first
    assert first == pytest.approx(1 - 24 / 39)  # the step: F0 + 8 x 4.5 + B0 = 39


# --- what the model cannot honour: refused, not retried ---


def _model(depth: int = 4) -> nn.Module:
    return models.create("transformer", input_dim=6, max_length=4, dim=16, depth=depth)


def test_stages_more_than_layers_or_an_unknown_split_point_are_refused() -> None:
    with pytest.raises(SpecRefused, match=r"pipeline.stages: 5 stages but .* 4 layer"):
        stage_bounds(_model(), 5)
    with pytest.raises(SpecRefused, match=r"split_points: 'blocks.9' names no layer"):
        stage_bounds(_model(), 2, ["blocks.9"])
    with pytest.raises(SpecRefused, match="in order"):
        stage_bounds(_model(), 3, ["blocks.2", "blocks.1"])
    with pytest.raises(SpecRefused, match="cannot be cut into stages"):
        stage_bounds(models.create("lenet5"), 2)
    with pytest.raises(SpecRefused, match=r"names 'blocks\.0\.nope', no module"):
        check_plan(_model(), {"blocks.0.nope": "colwise"}, 2)
    with pytest.raises(SpecRefused, match="does not divide by tensor=3"):
        check_plan(_model(), _model().tensor_parallel_plan(), 3)


def test_stages_split_evenly_and_keep_the_names_of_the_whole_model() -> None:
    assert stage_bounds(_model(), 2) == [(0, 2), (2, 4)]
    assert stage_bounds(_model(), 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert stage_bounds(_model(), 2, ["blocks.1"]) == [(0, 1), (1, 4)]
    whole = _model()
    names = set(whole.state_dict())
    last = keep_stage(_model(), 1, [(0, 2), (2, 4)])
    kept = set(last.state_dict())
    assert kept < names
    assert {k.split(".")[0] for k in kept} == {"blocks", "norm", "head"}
    assert all(k.startswith(("blocks.2.", "blocks.3.")) for k in kept if "blocks" in k)
    # the last stage takes the first stage's hidden state
    hidden = torch.randn(2, 4, 16)
    assert last(hidden).shape == (2, 10)
    sequential = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 2))
    bounds = stage_bounds(sequential, 2)
    assert bounds[0][0] == 0
    assert bounds[-1][1] == 4
