"""Net2Net growth: every supported transform on every zoo model keeps the function; the rest is
refused with the layer and the reason; a grown model still trains."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from trainhub import models
from trainhub.models.net2net import GrowthError, deeper, wider


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Small models run faster on one thread than on contended cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# (model, kwargs, input shape, layers to widen, layers to deepen)
SUPPORTED = [
    (
        "mlp",
        {"in_features": 64, "hidden": (32, 16)},
        (8, 1, 8, 8),
        ["blocks.0.linear", "blocks.1.linear"],
        ["blocks.0.linear", "blocks.1.linear"],
    ),
    (
        "lenet5",
        {},
        (8, 1, 28, 28),
        ["features.0", "features.3", "classifier.1", "classifier.3"],
        ["features.0", "features.3", "classifier.1", "classifier.3"],
    ),
    (
        "resnet20",
        {"in_channels": 1},
        (8, 1, 28, 28),
        [f"blocks.{i}.conv1" for i in range(9)],
        ["stem.0", "blocks.0.conv1", "blocks.3.conv1", "blocks.8.conv1"],
    ),
    (
        "resnet18",
        {"num_classes": 10, "small_input": True},
        (4, 3, 16, 16),
        ["blocks.0.conv1", "blocks.2.conv1", "blocks.7.conv1"],
        ["stem.0", "blocks.2.conv1"],
    ),
]


def settled(name: str, kwargs: dict, shape: tuple) -> nn.Module:
    """A model with non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(0)
    net = models.create(name, **kwargs)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(*shape) * 2 + 0.5)
    return net.eval()


def assert_same_function(before: nn.Module, after: nn.Module, shape: tuple) -> None:
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = before(x)
        got = after.eval()(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("name", "kwargs", "shape", "widen", "deepen"), SUPPORTED)
def test_wider_preserves_the_function_of_every_supported_layer(
    name: str, kwargs: dict, shape: tuple, widen: list[str], deepen: list[str]
) -> None:
    net = settled(name, kwargs, shape)
    for layer in widen:
        grown = wider(net, layer, 2.0)
        old = net.get_submodule(layer)
        new = grown.get_submodule(layer)
        assert new.weight.shape[0] == 2 * old.weight.shape[0], layer
        assert_same_function(net, grown, shape)


@pytest.mark.parametrize(("name", "kwargs", "shape", "widen", "deepen"), SUPPORTED)
def test_deeper_preserves_the_function_of_every_supported_layer(
    name: str, kwargs: dict, shape: tuple, widen: list[str], deepen: list[str]
) -> None:
    net = settled(name, kwargs, shape)
    for layer in deepen:
        grown = deeper(net, layer)
        added = sum(p.numel() for p in grown.parameters()) - models.count_parameters(net)
        assert added > 0, layer
        assert_same_function(net, grown, shape)


def test_uneven_split_with_noise_still_preserves_and_breaks_symmetry() -> None:
    shape = (8, 1, 28, 28)
    net = settled("lenet5", {}, shape)
    grown = wider(net, "classifier.1", 1.5, noise=0.1)
    assert grown.get_submodule("classifier.1").out_features == 180
    assert_same_function(net, grown, shape)
    consumer = grown.get_submodule("classifier.3").weight
    original = net.get_submodule("classifier.3").weight
    # the copies' shares differ from an even split
    assert not torch.allclose(consumer[:, :120], original)


def test_transforms_compose_and_leave_the_input_model_untouched() -> None:
    shape = (8, 1, 28, 28)
    net = settled("lenet5", {}, shape)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    grown = deeper(wider(wider(net, "features.3", 2.0), "classifier.1", 2.0), "features.3")
    assert_same_function(net, grown, shape)
    for key, value in net.state_dict().items():
        assert torch.equal(value, state[key])


@pytest.mark.parametrize(
    ("name", "kwargs", "layer", "transform", "message"),
    [
        ("mlp", {"in_features": 64}, "head", wider, "the model's output"),
        ("mlp", {"in_features": 64}, "head", deeper, "not (through one BatchNorm) to a ReLU"),
        ("resnet20", {}, "blocks.0.conv2", wider, "a residual sum"),
        ("resnet20", {}, "blocks.0.conv2", deeper, "a residual sum"),
        ("resnet20", {}, "stem.0", wider, "a residual sum"),
        ("resnet20", {}, "blocks.0.bn1", wider, "a BatchNorm widens with the layer"),
        ("resnet20", {}, "blocks.3.shortcut", wider, "its type is PadShortcut"),
        ("lenet5", {}, "features.9", wider, "no layer named 'features.9'"),
        ("transformer", {}, "blocks.0.mlp.0", wider, "cannot be traced by torch.fx"),
    ],
)
def test_unsupported_layers_are_refused_with_the_layer_and_the_reason(
    name: str, kwargs: dict, layer: str, transform: object, message: str
) -> None:
    net = models.create(name, **kwargs)
    grow = (lambda: wider(net, layer, 2.0)) if transform is wider else (lambda: deeper(net, layer))
    with pytest.raises(GrowthError) as info:
        grow()
    assert layer in str(info.value)
    assert message in str(info.value)


def test_bad_factor_is_refused() -> None:
    net = models.create("lenet5")
    with pytest.raises(GrowthError, match="factor must lie in"):
        wider(net, "features.0", 0.5)


def test_a_grown_model_keeps_training() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 4, (64,))  # memorising random labels needs every layer to learn
    net = models.create("lenet5", num_classes=4)
    grown = deeper(wider(net, "features.0", 2.0, noise=0.05), "classifier.1").train()
    optimizer = torch.optim.Adam(grown.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(grown(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
