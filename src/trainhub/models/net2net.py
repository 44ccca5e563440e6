"""Net2Net growth (Chen, Goodfellow and Shlens 2016): make a trained model wider or deeper
without changing what it computes, then keep training it.

    >>> from trainhub import models
    >>> from trainhub.models.net2net import deeper, wider
    >>> net = models.create("lenet5")
    >>> wide = wider(net, "features.0", 2.0)      # 6 -> 12 filters; features.3 takes 12 inputs
    >>> deep = deeper(wide, "classifier.1")       # an identity Linear(120, 120) + ReLU after it

Both return a new model (the argument is left untouched) whose outputs equal the old model's in
eval mode, to float tolerance. Which layer feeds which is read from a :mod:`torch.fx` trace of
the model (docs/adr/0016-net2net-consumers-from-fx.md), so the transforms work on any model that
traces and refuse, naming the layer and the reason, where growth would not preserve the
function:

- ``wider`` grows the output units of a ``Linear`` or the filters of a ``Conv2d`` (not grouped),
  copies the ``BatchNorm`` that normalises them, and splits the consumers' incoming weights among
  the copies. Between the layer and its consumers only element-wise or per-channel operations
  (activations, dropout, pooling, flatten) may stand; a residual sum, a concatenation, a
  slice or the model's output cannot take more channels, so those layers are refused.
- ``deeper`` inserts an identity-initialised layer of the same kind (a 3x3 convolution for
  ``Conv2d``) after the layer's ReLU, with a ``BatchNorm`` of identity statistics when the layer
  has one: ``relu(I · relu(h)) = relu(h)``. The layer must reach a ReLU directly or through its
  ``BatchNorm``.

Supported on the zoo: ``mlp`` (every hidden ``blocks.N.linear``), ``lenet5`` (``features.0``,
``features.3``, ``classifier.1``, ``classifier.3``), ``resnet20`` / ``resnet18``
(``blocks.N.conv1`` of every block; ``deeper`` also on the stem ``stem.0``). The classifier heads
and the convolutions whose output joins a residual sum are refused.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.nn import functional as F

__all__ = ["GrowthError", "deeper", "wider"]

_MAX_FACTOR = 16.0


class GrowthError(ValueError):
    """A layer cannot be grown in a function-preserving way; the message says which and why."""


# per-element or per-channel operations: a copied channel stays a copy through them
_PASS_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Dropout,
    nn.Identity,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)
_PASS_FUNCTIONS: set[Callable[..., object]] = {
    F.relu,
    torch.relu,
    F.gelu,
    F.silu,
    torch.sigmoid,
    torch.tanh,
    F.dropout,
    F.max_pool2d,
    F.avg_pool2d,
    F.adaptive_avg_pool2d,
    F.adaptive_max_pool2d,
}
_PASS_METHODS = {"relu", "sigmoid", "tanh", "contiguous"}
_RELU_MODULES: tuple[type[nn.Module], ...] = (nn.ReLU,)
_RELU_FUNCTIONS: set[Callable[..., object]] = {F.relu, torch.relu}
_BATCH_NORMS: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass
class _Consumers:
    """Where a layer's output units go: norms to copy, layers whose inputs to split."""

    norms: list[str]
    layers: list[tuple[str, bool]]  # (name, reached through a flatten)


def wider(model: nn.Module, layer_name: str, factor: float, *, noise: float = 0.0) -> nn.Module:
    """Net2WiderNet: ``layer_name`` gets ``round(width * factor)`` output units.

    New units copy randomly chosen old ones; each consumer's incoming weights of a copied unit
    are split among its copies. With ``noise > 0`` the split is uneven (random shares that still
    sum to one), which breaks the copies' symmetry and keeps the function exact, unlike noise
    added to the weights.

    Args:
        model: The model to grow (not modified).
        layer_name: A ``Linear`` or ``Conv2d`` (``model.get_submodule`` name, e.g. ``fc1``).
        factor: Growth of the width, ``1 <= factor <= 16``.
        noise: Standard deviation of the shares' deviation from an even split.

    Returns:
        A grown copy that computes the same function in eval mode.

    Raises:
        GrowthError: the layer does not exist, is of another kind, or its output cannot widen.
    """
    if not 1.0 <= factor <= _MAX_FACTOR:
        raise GrowthError(
            f"wider {layer_name}: factor must lie in [1, {_MAX_FACTOR}]; got {factor}"
        )
    if noise < 0:
        raise GrowthError(f"wider {layer_name}: noise must be >= 0; got {noise}")
    layer = _layer(model, layer_name)
    if isinstance(layer, _BATCH_NORMS):
        raise GrowthError(
            f"wider {layer_name}: a BatchNorm widens with the layer that feeds it; widen that "
            "layer instead"
        )
    if not isinstance(layer, nn.Linear | nn.Conv2d):
        raise GrowthError(
            f"wider {layer_name}: only Linear and Conv2d layers widen; its type is "
            f"{type(layer).__name__}"
        )
    if isinstance(layer, nn.Conv2d) and layer.groups != 1:
        raise GrowthError(
            f"wider {layer_name}: grouped convolutions (groups={layer.groups}) do not widen"
        )
    old = _width(layer)
    new = round(old * factor)
    consumers = _consumers(model, layer_name)
    grown = copy.deepcopy(model)
    if new == old:
        return grown
    mapping = torch.cat([torch.arange(old), torch.randint(0, old, (new - old,))])
    shares = _shares(mapping, old, noise)
    _set(grown, layer_name, _widen_outputs(_layer(grown, layer_name), mapping))
    for name in consumers.norms:
        _set(grown, name, _widen_norm(_layer(grown, name), mapping))
    for name, flattened in consumers.layers:
        _set(grown, name, _widen_inputs(_layer(grown, name), mapping, shares, old, flattened))
    return grown


def deeper(model: nn.Module, layer_name: str) -> nn.Module:
    """Net2DeeperNet: insert an identity layer (+ BatchNorm, + ReLU) after ``layer_name``.

    ``layer_name`` must reach a ReLU directly or through one BatchNorm; the new layer sits after
    that ReLU as ``ReLU -> identity layer [-> identity BatchNorm]`` inside the module that held
    the last of them (it becomes an ``nn.Sequential``: its parameters are then named ``.0.``),
    and the model's own ReLU follows, which changes nothing for non-negative inputs.

    Args:
        model: The model to grow (not modified).
        layer_name: A ``Linear`` or ``Conv2d``.

    Returns:
        A deeper copy that computes the same function in eval mode.

    Raises:
        GrowthError: the layer does not exist, is of another kind, or reaches no ReLU.
    """
    layer = _layer(model, layer_name)
    if not isinstance(layer, nn.Linear | nn.Conv2d):
        raise GrowthError(
            f"deeper {layer_name}: only Linear and Conv2d layers deepen; its type is "
            f"{type(layer).__name__}"
        )
    graph = _trace(model, layer_name)
    node = _node(graph, layer_name)
    tail = layer_name
    users = list(node.users)
    if len(users) == 1 and _is_module(graph, users[0], _BATCH_NORMS):
        tail = str(users[0].target)
        users = list(users[0].users)
    if not (len(users) == 1 and _is_relu(graph, users[0])):
        what = ", ".join(_describe(graph, u) for u in users) or "the model's output"
        raise GrowthError(
            f"deeper {layer_name}: its output goes to {what}, not (through one BatchNorm) to a "
            "ReLU alone; an identity layer is function-preserving only after a ReLU"
        )
    grown = copy.deepcopy(model)
    width = _width(layer)
    inserted: list[nn.Module] = [_layer(grown, tail), nn.ReLU()]
    identity: nn.Linear | nn.Conv2d
    if isinstance(layer, nn.Linear):
        identity = nn.Linear(width, width, bias=layer.bias is not None)
        with torch.no_grad():
            identity.weight.copy_(torch.eye(width))
    else:
        identity = nn.Conv2d(width, width, 3, padding=1, bias=layer.bias is not None)
        with torch.no_grad():
            identity.weight.zero_()
            identity.weight[torch.arange(width), torch.arange(width), 1, 1] = 1.0
    if identity.bias is not None:
        with torch.no_grad():
            identity.bias.zero_()
    inserted.append(identity)
    if tail != layer_name:
        norm = type(_layer(model, tail))(width)  # same BatchNorm kind
        assert isinstance(norm, nn.BatchNorm1d | nn.BatchNorm2d)
        assert norm.running_var is not None
        with torch.no_grad():
            norm.running_var.fill_(1.0 - norm.eps)  # sqrt(var + eps) = 1: exactly identity
        inserted.append(norm)
    reference = next(layer.parameters())
    _set(grown, tail, nn.Sequential(*inserted).to(reference.device, reference.dtype))
    return grown


# ---- graph analysis ---------------------------------------------------------------------------


def _trace(model: nn.Module, layer_name: str) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:  # fx raises many kinds on dynamic control flow
        raise GrowthError(
            f"growing {layer_name}: the model cannot be traced by torch.fx ({exc}); Net2Net "
            "needs the trace to find the layers that consume its output"
        ) from None


def _node(graph: fx.GraphModule, layer_name: str) -> fx.Node:
    calls = [n for n in graph.graph.nodes if n.op == "call_module" and n.target == layer_name]
    if len(calls) != 1:
        raise GrowthError(
            f"growing {layer_name}: the layer is called {len(calls)} times in forward; only a "
            "layer called once can grow"
        )
    node: fx.Node = calls[0]
    return node


def _is_module(graph: fx.GraphModule, node: fx.Node, kinds: tuple[type[nn.Module], ...]) -> bool:
    return node.op == "call_module" and isinstance(graph.get_submodule(str(node.target)), kinds)


def _is_relu(graph: fx.GraphModule, node: fx.Node) -> bool:
    if _is_module(graph, node, _RELU_MODULES):
        return True
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return True
    return node.op == "call_method" and node.target == "relu"


def _describe(graph: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"{node.target} ({type(graph.get_submodule(str(node.target))).__name__})"
    if node.op == "output":
        return "the model's output"
    target = node.target
    name = getattr(target, "__name__", str(target))
    if target in (operator.add, torch.add, operator.iadd):
        return f"a residual sum ({name})"
    return f"{node.op} {name}"


def _passes(graph: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(graph.get_submodule(str(node.target)), _PASS_MODULES)
    if node.op == "call_function":
        return node.target in _PASS_FUNCTIONS
    return node.op == "call_method" and node.target in _PASS_METHODS


def _is_flatten(graph: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        module = graph.get_submodule(str(node.target))
        return isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1
    if node.op == "call_function" and node.target is torch.flatten:
        return tuple(node.args[1:]) == (1,) and not node.kwargs
    if node.op == "call_method" and node.target == "flatten":
        return tuple(node.args[1:]) == (1,) and not node.kwargs
    return False


def _consumers(model: nn.Module, layer_name: str) -> _Consumers:
    graph = _trace(model, layer_name)
    found = _Consumers([], [])
    seen: set[fx.Node] = set()

    def walk(node: fx.Node, flattened: bool) -> None:
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_module":
                module = graph.get_submodule(str(user.target))
                name = str(user.target)
                if isinstance(module, _BATCH_NORMS) and not flattened:
                    found.norms.append(name)
                    walk(user, flattened)
                    continue
                if isinstance(module, nn.Linear) or (
                    isinstance(module, nn.Conv2d) and module.groups == 1 and not flattened
                ):
                    found.layers.append((name, flattened))
                    continue
            if _passes(graph, user):
                walk(user, flattened)
                continue
            if _is_flatten(graph, user):
                walk(user, True)
                continue
            raise GrowthError(
                f"wider {layer_name}: its output reaches {_describe(graph, user)}, which cannot "
                "take more channels in a function-preserving way (only Linear/Conv2d consumers, "
                "BatchNorm, activations, dropout, pooling and flatten may follow the layer)"
            )

    walk(_node(graph, layer_name), False)
    if not found.layers:
        raise GrowthError(f"wider {layer_name}: no Linear or Conv2d consumes its output")
    return found


# ---- weight surgery ---------------------------------------------------------------------------


def _layer(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise GrowthError(f"growing {name}: the model has no layer named {name!r}") from None


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _width(layer: nn.Module) -> int:
    if isinstance(layer, nn.Linear):
        return layer.out_features
    assert isinstance(layer, nn.Conv2d)
    return layer.out_channels


def _shares(mapping: torch.Tensor, old: int, noise: float) -> torch.Tensor:
    """Each new unit's share of its source unit's outgoing weights; shares of a source sum to 1."""
    counts = torch.bincount(mapping, minlength=old).to(torch.float64)
    shares = 1.0 / counts[mapping]
    if noise > 0:
        jitter = torch.randn(len(mapping), dtype=torch.float64) * noise
        mean = torch.zeros(old, dtype=torch.float64).index_add_(0, mapping, jitter) / counts
        shares = shares + jitter - mean[mapping]  # centred per source: the sum stays 1
    return shares


def _widen_outputs(layer: nn.Module, mapping: torch.Tensor) -> nn.Module:
    assert isinstance(layer, nn.Linear | nn.Conv2d)
    weight = layer.weight.detach()
    bias = None if layer.bias is None else layer.bias.detach()
    new = len(mapping)
    grown: nn.Linear | nn.Conv2d
    if isinstance(layer, nn.Linear):
        grown = nn.Linear(layer.in_features, new, bias=bias is not None)
    else:
        assert isinstance(layer, nn.Conv2d)
        grown = _conv_like(layer, layer.in_channels, new)
    grown = grown.to(weight.device, weight.dtype)
    with torch.no_grad():
        grown.weight.copy_(weight[mapping])
        if bias is not None and grown.bias is not None:
            grown.bias.copy_(bias[mapping])
    return grown


def _widen_norm(norm: nn.Module, mapping: torch.Tensor) -> nn.Module:
    assert isinstance(norm, nn.BatchNorm1d | nn.BatchNorm2d)
    grown = type(norm)(
        len(mapping),
        eps=norm.eps,
        momentum=norm.momentum,
        affine=norm.affine,
        track_running_stats=norm.track_running_stats,
    )
    reference = norm.weight if norm.affine else norm.running_mean
    grown = grown.to(reference.device if reference is not None else "cpu")
    with torch.no_grad():
        for key in ("weight", "bias", "running_mean", "running_var"):
            value = getattr(norm, key)
            if value is not None:
                getattr(grown, key).copy_(value[mapping])
        if norm.num_batches_tracked is not None and grown.num_batches_tracked is not None:
            grown.num_batches_tracked.copy_(norm.num_batches_tracked)
    return grown


def _widen_inputs(
    layer: nn.Module, mapping: torch.Tensor, shares: torch.Tensor, old: int, flattened: bool
) -> nn.Module:
    assert isinstance(layer, nn.Linear | nn.Conv2d)
    weight = layer.weight.detach()
    new = len(mapping)
    grown: nn.Linear | nn.Conv2d
    if isinstance(layer, nn.Linear):
        block = layer.in_features // old  # features per channel after a flatten (H*W)
        if layer.in_features != block * old or (block != 1 and not flattened):
            raise GrowthError(
                f"wider: the consumer's {layer.in_features} inputs are not a multiple of the "
                f"widened layer's {old} units"
            )
        # input feature c*block + s comes from channel c (flatten keeps channels outermost)
        columns = (mapping[:, None] * block + torch.arange(block)[None, :]).reshape(-1)
        scale = shares.repeat_interleave(block).to(weight.dtype).to(weight.device)
        grown = nn.Linear(new * block, layer.out_features, bias=layer.bias is not None)
        grown = grown.to(weight.device, weight.dtype)
        with torch.no_grad():
            grown.weight.copy_(weight[:, columns] * scale)
    else:
        assert isinstance(layer, nn.Conv2d)
        grown = _conv_like(layer, new, layer.out_channels).to(weight.device, weight.dtype)
        scale = shares.to(weight.dtype).to(weight.device)[None, :, None, None]
        with torch.no_grad():
            grown.weight.copy_(weight[:, mapping] * scale)
    if layer.bias is not None and grown.bias is not None:
        with torch.no_grad():
            grown.bias.copy_(layer.bias.detach())
    return grown


def _conv_like(layer: nn.Conv2d, in_channels: int, out_channels: int) -> nn.Conv2d:
    return nn.Conv2d(
        in_channels,
        out_channels,
        layer.kernel_size,  # type: ignore[arg-type]
        stride=layer.stride,  # type: ignore[arg-type]
        padding=layer.padding,  # type: ignore[arg-type]
        dilation=layer.dilation,  # type: ignore[arg-type]
        bias=layer.bias is not None,
        padding_mode=layer.padding_mode,
    )
