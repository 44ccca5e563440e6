"""The model zoo: every model by name, its output shape, its size, and its blocks."""

from __future__ import annotations

import pytest
import torch

from trainhub import models
from trainhub.models.mlp import hidden_for_parameters
from trainhub.runtime.distributed.memory import apply_activation_checkpointing, block_types

CASES = [
    ("mlp", {"in_features": 64, "hidden": (32,)}, (4, 1, 8, 8)),
    ("lenet5", {}, (4, 1, 28, 28)),
    ("lenet5", {"in_channels": 3, "image_size": 32}, (4, 3, 32, 32)),
    ("resnet20", {"in_channels": 1}, (4, 1, 28, 28)),
    ("resnet20", {}, (4, 3, 32, 32)),
    ("resnet18", {"num_classes": 10, "small_input": True}, (2, 3, 32, 32)),
    ("transformer", {"input_dim": 28, "max_length": 28}, (4, 1, 28, 28)),
]


def test_available_lists_every_name() -> None:
    assert models.available() == ["lenet5", "mlp", "resnet18", "resnet20", "transformer"]


@pytest.mark.parametrize(("name", "kwargs", "shape"), CASES)
def test_logits_have_one_column_per_class(name: str, kwargs: dict, shape: tuple) -> None:
    torch.manual_seed(0)
    net = models.create(name, **kwargs)
    logits = net(torch.randn(*shape))
    assert logits.shape == (shape[0], kwargs.get("num_classes", 10))
    logits.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("resnet20", {}, 269_722),  # He et al. 2016, table 6: 0.27M
        ("resnet18", {}, 11_689_512),  # the ImageNet ResNet-18
        ("lenet5", {}, 61_706),
    ],
)
def test_parameter_counts_match_the_papers(name: str, kwargs: dict, expected: int) -> None:
    assert models.count_parameters(models.create(name, **kwargs)) == expected


def test_names_ignore_case_and_separators() -> None:
    assert isinstance(models.create("ResNet-20"), type(models.create("resnet20")))
    with pytest.raises(ValueError, match="unknown model 'vgg16'; available: lenet5"):
        models.create("vgg16")


def test_token_transformer() -> None:
    net = models.create("transformer", vocab_size=100, num_classes=3, max_length=16)
    assert net(torch.randint(0, 100, (2, 16))).shape == (2, 3)
    with pytest.raises(ValueError, match="exceeds max_length"):
        net(torch.randint(0, 100, (2, 17)))


def test_transformer_attention_is_multihead_attention_and_loads_its_checkpoints() -> None:
    """q, k, v and out as four Linears (splittable by heads) compute what
    nn.MultiheadAttention does, and a state dict saved with it loads."""
    torch.manual_seed(0)
    old = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    net = models.create("transformer", input_dim=6, max_length=5, dim=16, depth=2, num_heads=4)
    attention = net.blocks[0].attention
    attention.load_state_dict(old.state_dict())
    x = torch.randn(3, 5, 16)
    expected, _ = old(x, x, x, need_weights=False)
    assert torch.allclose(attention(x), expected, atol=1e-6)
    assert models.count_parameters(attention) == models.count_parameters(old)


def test_transformer_tensor_plan_splits_attention_by_whole_heads() -> None:
    net = models.create("transformer", input_dim=6, max_length=4, dim=16, depth=2, num_heads=2)
    split = net.tensor_parallel_plan(2)
    assert split["blocks.1.attention.query"] == "colwise"
    assert split["blocks.1.attention.out"] == "rowwise"
    assert split["blocks.1.mlp.3"] == "rowwise"
    assert len(split) == 12
    # 4 ranks cannot share 2 heads: attention stays replicated, the MLPs are split
    assert sorted(net.tensor_parallel_plan(4)) == [
        f"blocks.{i}.mlp.{j}" for i in (0, 1) for j in (0, 3)
    ]


def test_mlp_width_for_a_parameter_budget() -> None:
    width = hidden_for_parameters(784, 10, 10_000_000)
    net = models.create("mlp", in_features=784, hidden=(width, width))
    assert 10_000_000 <= models.count_parameters(net) < 10_050_000


@pytest.mark.parametrize("name", ["mlp", "resnet20", "transformer", "lenet5"])
def test_activation_checkpointing_keeps_the_gradients(name: str) -> None:
    kwargs = {"in_features": 784} if name == "mlp" else {}
    if name == "resnet20":
        kwargs = {"in_channels": 1}
    torch.manual_seed(0)
    plain = models.create(name, **kwargs)
    torch.manual_seed(0)
    checkpointed = models.create(name, **kwargs)
    assert block_types(checkpointed)
    assert apply_activation_checkpointing(checkpointed) >= 1
    x = torch.randn(3, 1, 28, 28)
    plain.eval()
    checkpointed.eval()  # batch-norm statistics would differ across the recomputation
    plain(x).square().sum().backward()
    checkpointed(x).square().sum().backward()
    for (name_a, a), (_, b) in zip(
        plain.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        assert a.grad is not None, name_a
        assert b.grad is not None, name_a
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    # state_dict keys do not change, so checkpoints load either way
    assert plain.state_dict().keys() == checkpointed.state_dict().keys()
