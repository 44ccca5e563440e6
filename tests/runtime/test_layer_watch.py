"""ctx.watch: what a sample measures, that it leaves training alone, and where NaN starts."""

from __future__ import annotations

import copy
import gc
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainhub
from trainhub.core import layer_alerts
from trainhub.models.lenet import LeNet5
from trainhub.runtime import layer_watch
from trainhub.runtime.layer_watch import LayerWatch

Points = list[tuple[int, dict[str, float]]]


def recorder() -> tuple[Points, Callable[[int, dict[str, float]], None]]:
    points: Points = []
    return points, lambda step, values: points.append((step, values))


def train(model: nn.Module, steps: int, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def mlp(*sizes: int, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])


def test_the_wire_markers_match_the_alert_rules() -> None:
    assert layer_watch.NONFINITE_IN_ACTIVATIONS == layer_alerts.NONFINITE_IN_ACTIVATIONS
    assert layer_watch.NONFINITE_IN_GRADIENTS == layer_alerts.NONFINITE_IN_GRADIENTS
    assert layer_watch.METRIC_PREFIX == layer_alerts.PREFIX


def test_watch_leaves_gradients_and_training_unchanged() -> None:
    torch.manual_seed(0)
    plain = LeNet5()
    watched = copy.deepcopy(plain)
    points, report = recorder()
    LayerWatch(watched, every=1, report=report)
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    for model in (plain, watched):
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
    for (name, a), b in zip(plain.named_parameters(), watched.parameters(), strict=True):
        assert a.grad is not None
        assert b.grad is not None
        assert torch.equal(a.grad, b.grad), name
    train(plain, 3, x, y)
    train(watched, 3, x, y)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)
    assert [step for step, _ in points] == [0, 1, 2]  # the 4th sample waits for a forward


def test_hooks_are_installed_on_sampled_steps_only() -> None:
    model = mlp(4, 8, 3)
    points, report = recorder()
    watch = LayerWatch(model, every=3, report=report)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    hooked = []
    seen = lambda m, a, o: hooked.append(len(model[0]._forward_hooks))  # noqa: E731
    model[1].register_forward_hook(seen)  # runs after the watch's hook of model[1]
    train(model, 7, x, y)
    watch.flush()
    assert hooked == [1, 0, 0, 1, 0, 0, 1]
    assert [s for s, _ in points] == [0, 3, 6]
    with torch.no_grad():
        model.eval()
        model(x)  # evaluation forwards are not training steps
    assert watch.step == 7


def test_statistics_of_a_constructed_layer() -> None:
    fc = nn.Linear(3, 4)
    with torch.no_grad():
        fc.weight.zero_()
        fc.weight[0, 0] = 1.0  # unit 0 follows x0: alive for positive inputs
        fc.bias.copy_(torch.tensor([0.0, -1.0, -2.0, 0.5]))  # units 1, 2: dead; 3: alive
    model = nn.Sequential(fc, nn.ReLU(), nn.Linear(4, 2))
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report)
    x = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 2.0, 0.0]])
    y = torch.tensor([0, 1])
    before = fc.weight.detach().clone(), fc.bias.detach().clone()
    weight_norm = math.sqrt(sum(float(t.pow(2).sum()) for t in before))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    grad_norm = math.sqrt(float(fc.weight.grad.pow(2).sum() + fc.bias.grad.pow(2).sum()))  # type: ignore[union-attr]
    opt.step()
    watch.flush()
    [(step, values)] = points
    assert step == 0
    assert values["layers/1/dead_fraction"] == 0.5
    assert values["layers/0/weight_norm"] == pytest.approx(weight_norm)
    assert values["layers/0/grad_norm"] == pytest.approx(grad_norm)
    # SGD moved the weights by lr * grad
    assert values["layers/0/update_ratio"] == pytest.approx(0.5 * grad_norm / weight_norm)
    # ReLU outputs before the step: [1, 0, 0, .5] and [0, 0, 0, .5]
    assert values["layers/1/act_mean"] == pytest.approx(0.25)
    assert "layers/2/dead_fraction" not in values


def test_dead_channels_of_a_feature_map_and_saturated_tanh() -> None:
    conv = nn.Conv2d(1, 4, 1)
    with torch.no_grad():
        conv.weight.fill_(1.0)
        conv.bias.copy_(torch.tensor([0.0, -100.0, -100.0, -100.0]))
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(4 * 9, 6), nn.Tanh())
    with torch.no_grad():
        model[3].weight.fill_(0.0)
        model[3].bias.copy_(torch.tensor([10.0, -10.0, 10.0, 0.0, 0.0, 0.0]))
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report)
    model(torch.rand(4, 1, 3, 3)).sum().backward()
    watch.flush()
    values = points[0][1]
    assert values["layers/1/dead_fraction"] == 0.75
    assert values["layers/4/saturated_fraction"] == 0.5


def test_a_nan_weight_in_a_middle_layer_is_named() -> None:
    torch.manual_seed(0)
    model = LeNet5()
    points, report = recorder()
    watch = LayerWatch(model, every=2, report=report)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    train(model, 2, x, y)  # steps 0 (sampled), 1
    with torch.no_grad():
        model.classifier[3].weight[5, 7] = float("nan")
    train(model, 1, x, y)  # step 2 (sampled): the NaN enters at classifier.3
    watch.flush()
    assert [s for s, _ in points] == [0, 2]
    assert not any("nonfinite" in k for k in points[0][1])
    bad = {k: v for k, v in points[1][1].items() if k.endswith("/nonfinite")}
    assert bad == {"layers/classifier.3/nonfinite": layer_watch.NONFINITE_IN_ACTIVATIONS}
    assert all(math.isfinite(v) for v in points[1][1].values())  # the wire takes finite numbers
    [alert] = layer_alerts.evaluate(2, points[1][1])
    assert (alert.kind, alert.layer, alert.step) == ("nonfinite", "classifier.3", 2)


def test_a_nan_born_in_the_backward_pass_names_the_layer_it_reaches_first() -> None:
    model = mlp(4, 8, 8, 3)
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report)
    out = model(torch.randn(2, 4))
    torch.sqrt(out - out).sum().backward()  # forward 0; backward d sqrt(0) = inf, times 0
    watch.flush()
    bad = {k: v for k, v in points[0][1].items() if k.endswith("/nonfinite")}
    assert bad == {"layers/4/nonfinite": layer_watch.NONFINITE_IN_GRADIENTS}


def test_a_deep_model_ships_a_bounded_spread_of_layers_but_checks_all() -> None:
    model = mlp(*([6] * 41))  # 40 linear + 39 relu layers
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report, max_layers=8)
    assert len(watch.layer_names) == 8
    assert watch.layer_names[0] == "0"
    assert watch.layer_names[-1] == "78"
    with torch.no_grad():
        model[40].weight.fill_(float("inf"))  # not a shipped layer
    model(torch.randn(3, 6)).sum().backward()
    watch.flush()
    values = points[0][1]
    assert {k.split("/")[1] for k in values} - {"40"} <= set(watch.layer_names)
    assert values["layers/40/nonfinite"] == 1.0
    assert len(values) <= 8 * 5 + 1
    with pytest.raises(ValueError, match="max_layers"):
        LayerWatch(model, every=1, report=report, max_layers=500)
    with pytest.raises(ValueError, match="every"):
        LayerWatch(model, every=0, report=report)


def _watch_a_ddp_model() -> list[tuple[int, dict[str, float]]]:
    model = DistributedDataParallel(mlp(4, 8, 3))
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report)
    train(model, 2, torch.randn(5, 4), torch.randint(0, 3, (5,)))
    watch.flush()
    return points


def test_a_ddp_model_from_prepare_model_is_looked_through(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        points = _watch_a_ddp_model()
    finally:
        # DDP's reducer holds the process group: free it (and the watch's hook cycles) while
        # the group lives; freed after destroy_process_group, gloo's destructor can hang
        gc.collect()
        dist.destroy_process_group()
    assert [s for s, _ in points] == [0, 1]
    assert points[1][1]["layers/0/grad_norm"] > 0


def test_ctx_watch_reports_through_the_context(tmp_path: Path) -> None:
    ctx = trainhub.init(metrics_file=tmp_path / "m.jsonl")
    model = ctx.prepare_model(mlp(4, 8, 3))
    ctx.watch(model, every=2)
    train(model, 3, torch.randn(5, 4), torch.randint(0, 3, (5,)))
    ctx.close()  # ships the watch's last sample (step 2) too
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert '"layers/0/grad_norm"' in lines[0]


def _digits_loader(batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pytest.importorskip("sklearn")
    from trainhub.data.digits import load_digits

    train_set = load_digits().train
    xs = torch.stack([train_set[i][0] for i in range(len(train_set))])
    ys = torch.tensor([int(train_set[i][1]) for i in range(len(train_set))])
    xs = nn.functional.interpolate(xs, size=28)
    return [(xs[i : i + batch], ys[i : i + batch]) for i in range(0, len(xs), batch)]


def _alerts(points: Points) -> set[tuple[str, str]]:
    return {(str(a.kind), a.layer) for s, v in points for a in layer_alerts.evaluate(s, v)}


def test_a_healthy_lenet_on_digits_raises_no_alert() -> None:
    torch.manual_seed(0)
    model = LeNet5()
    points, report = recorder()
    watch = LayerWatch(model, every=2, report=report)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in _digits_loader(64):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    watch.flush()
    assert len(points) >= 10
    assert _alerts(points) == set()


def test_deep_sigmoids_vanish_and_a_large_init_explodes() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    vanishing = mlp(*([16] * 15), 4, act=nn.Sigmoid)
    points, report = recorder()
    watch = LayerWatch(vanishing, every=2, report=report)
    train(vanishing, 3, x, y)
    watch.flush()
    found = _alerts(points)
    assert ("vanishing_gradients", "0") in found
    assert not any(kind == "exploding_gradients" for kind, _ in found)

    exploding = mlp(*([64] * 8), 4, act=nn.Identity)
    for module in exploding:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=1.0)
    points, report = recorder()
    watch = LayerWatch(exploding, every=1, report=report)
    train(exploding, 1, torch.randn(32, 64), y, lr=1e-3)
    watch.flush()
    found = _alerts(points)
    assert ("exploding_gradients", "0") in found
    assert not any(kind == "vanishing_gradients" for kind, _ in found)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_values_match_the_cpu_and_arrive_without_a_sync() -> None:
    torch.manual_seed(0)
    cpu_model = mlp(4, 8, 3)
    gpu_model = copy.deepcopy(cpu_model).cuda()
    cpu_points, cpu_report = recorder()
    gpu_points, gpu_report = recorder()
    watch = LayerWatch(gpu_model, every=2, report=gpu_report)
    cpu_watch = LayerWatch(cpu_model, every=2, report=cpu_report)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    train(cpu_model, 5, x, y)
    train(gpu_model, 5, x.cuda(), y.cuda())
    watch.flush()
    cpu_watch.flush()
    assert [s for s, _ in gpu_points] == [s for s, _ in cpu_points] == [0, 2, 4]
    for (_, g), (_, c) in zip(gpu_points, cpu_points, strict=True):
        assert g.keys() == c.keys()
        for key in g:
            assert g[key] == pytest.approx(c[key], rel=1e-4, abs=1e-6), key


def test_a_forward_that_raises_does_not_stop_the_watch() -> None:
    model = mlp(4, 8, 3)
    points, report = recorder()
    watch = LayerWatch(model, every=1, report=report)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5))  # wrong input width
    assert not model[0]._forward_hooks  # the sampled step's hooks are gone
    train(model, 2, torch.randn(2, 4), torch.randint(0, 3, (2,)))
    watch.flush()
    assert [s for s, _ in points] == [0, 1, 2]
