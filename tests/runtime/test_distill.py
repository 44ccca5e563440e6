"""Distillation in the runtime: the loss's arithmetic, the hint adapters, the teacher's weights."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainhub import models
from trainhub.distill_contract import DistillSpec
from trainhub.runtime.distill import (
    Distiller,
    TeacherError,
    distillation_loss,
    kd_loss,
    load_weights,
    make_distiller,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_kd_loss_is_the_temperature_scaled_kl_divergence() -> None:
    student = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    teacher = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.5, 2.0]])
    temperature = 3.0
    expected = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist(), strict=True):
        p = [math.exp(v / temperature) for v in t_row]
        q = [math.exp(v / temperature) for v in s_row]
        p = [v / sum(p) for v in p]
        q = [v / sum(q) for v in q]
        expected += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    expected = expected / 2 * temperature**2
    assert kd_loss(student, teacher, temperature).item() == pytest.approx(expected, rel=1e-5)
    assert kd_loss(teacher, teacher, temperature).item() == pytest.approx(0.0, abs=1e-6)


def test_alpha_weighs_soft_against_hard_targets() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(8, 10), torch.randn(8, 10)
    targets = torch.randint(0, 10, (8,))
    soft = kd_loss(student, teacher, 2.0)
    hard = F.cross_entropy(student, targets)
    for alpha in (0.0, 0.3, 1.0):
        got = distillation_loss(student, teacher, targets, temperature=2.0, alpha=alpha)
        assert got.item() == pytest.approx((alpha * soft + (1 - alpha) * hard).item(), rel=1e-6)


def test_the_kd_gradient_keeps_its_scale_across_temperatures() -> None:
    """Hinton et al.: with the T^2 factor the soft gradients stay O(1) as T grows."""
    torch.manual_seed(0)
    teacher = torch.randn(16, 10) * 3
    norms = []
    for temperature in (4.0, 16.0):
        student = (torch.randn(16, 10) * 3).requires_grad_()
        kd_loss(student, teacher, temperature).backward()
        assert student.grad is not None
        norms.append(student.grad.norm().item() * temperature)  # gradient ~ (s - t) / T
    assert 0.2 < norms[0] / norms[1] < 5


def lenets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    student = models.create("lenet5")
    teacher = models.create("resnet20", in_channels=1)
    return student, teacher


def test_hint_adapters_map_student_features_to_the_teachers_width() -> None:
    student, teacher = lenets()
    hints = [("features.3", "blocks.4"), ("features", "stem"), ("features.3", "head")]
    distiller = Distiller(student, teacher, hints=hints)
    maps = distiller.adapters.maps
    assert isinstance(maps[0], nn.Conv2d)  # maps to maps: a 1x1 convolution
    assert (maps[0].in_channels, maps[0].out_channels, maps[0].kernel_size) == (16, 32, (1, 1))
    assert isinstance(maps[1], nn.Conv2d)  # a block's width is its last layer's
    assert (maps[1].in_channels, maps[1].out_channels) == (16, 16)
    assert isinstance(maps[2], nn.Linear)  # a map to a vector: pooled, then linear
    assert (maps[2].in_features, maps[2].out_features) == (16, 10)
    assert {id(p) for p in distiller.parameters()} == {id(p) for m in maps for p in m.parameters()}
    assert all(not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    x = torch.randn(4, 1, 28, 28)
    distiller.loss(x, student(x), torch.randint(0, 10, (4,))).backward()
    assert all(p.grad is not None for p in distiller.parameters())


def test_a_vector_student_cannot_hint_a_feature_map() -> None:
    student, teacher = lenets()
    with pytest.raises(ValueError, match="hint a map with a map"):
        Distiller(student, teacher, hints=[("classifier.1", "blocks.4")])


def test_example_input_reads_shapes_when_layers_do_not_say() -> None:
    student = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    with pytest.raises(ValueError, match="pass example_input"):
        Distiller(student, teacher, hints=[("2", "2")])
    distiller = Distiller(student, teacher, hints=[("2", "2")], example_input=torch.zeros(2, 784))
    (adapter,) = distiller.adapters.maps
    assert isinstance(adapter, nn.Linear)
    assert (adapter.in_features, adapter.out_features) == (32, 64)


def test_training_with_hints_imitates_the_teacher_and_leaves_it_alone() -> None:
    student, teacher = lenets()
    teacher_state = {k: v.clone() for k, v in teacher.state_dict().items()}
    distiller = Distiller(
        student, teacher, temperature=2.0, alpha=0.7, hints=[("features.3", "blocks.4")]
    )
    optimizer = torch.optim.Adam([*student.parameters(), *distiller.parameters()], lr=3e-3)
    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    first: dict[str, float] = {}
    for step in range(15):
        loss = distiller.loss(x, student(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            first = {k: v.item() for k, v in distiller.last_terms.items()}
    last = {k: v.item() for k, v in distiller.last_terms.items()}
    assert set(last) == {"soft", "hard", "hints"}
    # the teacher is untrained here: the student learns to imitate it, not the labels
    assert last["soft"] < 0.5 * first["soft"]
    assert last["hints"] < 0.8 * first["hints"]
    for key, value in teacher.state_dict().items():  # eval mode: not even BatchNorm stats move
        assert torch.equal(value, teacher_state[key]), key
    distiller.close()
    student(x)  # no hook is left
    assert not distiller._student_features


def test_weights_load_from_a_path_a_checkpoint_dict_or_ddp_keys(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trained = models.create("lenet5")
    path = tmp_path / "teacher.pt"
    torch.save({"model": trained.state_dict(), "epoch": 3}, path)
    x = torch.randn(2, 1, 28, 28)
    expected = trained.eval()(x)
    for weights in (
        path,
        str(path),
        path.read_bytes(),
        trained.state_dict(),
        {f"module.{k}": v for k, v in trained.state_dict().items()},
    ):
        loaded = load_weights(models.create("lenet5"), weights).eval()
        torch.testing.assert_close(loaded(x), expected)
    torch.save({"model": trained.state_dict(), "architecture": {"name": "lenet5"}}, path)
    torch.testing.assert_close(load_weights(None, path).eval()(x), expected)


def test_teacher_mistakes_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TeacherError, match="no such file"):
        load_weights(models.create("lenet5"), tmp_path / "missing.pt")
    with pytest.raises(TeacherError, match="pass the teacher module"):
        load_weights(None, models.create("lenet5").state_dict())
    with pytest.raises(TeacherError, match="do not fit its architecture"):
        load_weights(models.create("mlp"), models.create("lenet5").state_dict())
    student = models.create("lenet5")
    spec = DistillSpec.from_mapping({"teacher": "trial:7"})
    with pytest.raises(TeacherError, match="standalone run cannot fetch it; pass weights="):
        make_distiller(
            student,
            models.create("lenet5"),
            weights=None,
            spec=spec,
            api_url=None,
            token=None,
            trial_id=None,
            device=torch.device("cpu"),
        )
    with pytest.raises(TeacherError, match="no teacher"):
        make_distiller(
            student,
            None,
            weights=None,
            spec=None,
            api_url=None,
            token=None,
            trial_id=None,
            device=torch.device("cpu"),
        )


def test_the_script_overrides_the_specs_settings() -> None:
    student, teacher = lenets()
    spec = DistillSpec.from_mapping(
        {
            "teacher": "m:1",
            "temperature": 8,
            "alpha": 0.5,
            "hints": [{"student": "features.3", "teacher": "blocks.4"}],
        }
    )
    distiller = make_distiller(
        student,
        teacher,
        weights=teacher.state_dict(),
        spec=spec,
        api_url=None,
        token=None,
        trial_id=None,
        device=torch.device("cpu"),
        alpha=0.25,
    )
    assert (distiller.temperature, distiller.alpha) == (8.0, 0.25)
    assert distiller.hints == [("features.3", "blocks.4")]
