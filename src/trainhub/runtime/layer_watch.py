"""Layer health: per-layer statistics sampled every N training steps (``ctx.watch``).

What one sample measures, per layer (a module with parameters of its own, or an activation
module such as ``nn.ReLU``), at training step ``s`` (the ``s``-th forward pass of the model in
training mode, counted from ``start_step``):

- ``grad_norm``: L2 norm of the layer's parameter gradients of that step (under DDP: rank 0's
  local gradients, before the all-reduce averages them);
- ``weight_norm``: L2 norm of its parameters before the optimizer step;
- ``update_ratio``: ``||w(s+1) - w(s)|| / ||w(s)||``, the relative change the optimizer made
  in that one step (healthy SGD/Adam training sits near 1e-3);
- ``act_mean``, ``act_std``: of the layer's output over the batch;
- ``dead_fraction`` (ReLU, ReLU6): the fraction of units (features, or channels of a feature
  map) that are zero for every sample of the batch;
- ``saturated_fraction`` (Tanh, Hardtanh: ``|y| > 0.99``; Sigmoid: ``y < 0.01`` or
  ``y > 0.99``): the fraction of outputs in the flat part of the curve.

NaN/Inf: every sample checks each layer's output (in forward order) and the gradient flowing
into it (in backward order) and names the first layer where a non-finite value appeared.

Cost: on unsampled steps the model runs with two Python pre/post hooks on its root that count
steps and return; nothing is synchronised with the device. On a sampled step the per-layer
hooks are installed for that one step, every statistic stays a device tensor, and the step
after copies them to the host in one transfer (asynchronously on a GPU: the values are read
once the copy has finished, at a later forward pass), so no step waits on the device. The
weights of the sampled step are copied once on the device to measure the update; the copy
lives for one step.

What is shipped: metrics ``layers/<module name>/<statistic>`` at the sampled step (at most
``max_layers`` layers, chosen evenly over the model when it has more), and for a non-finite
value ``layers/<first layer>/nonfinite`` = 1 (in the forward activations) or 2 (in the
backward gradients). The control plane turns these into alerts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainhub.runtime import protocol
from trainhub.runtime.model import unwrap_model

# one point holds every statistic of the watched layers: 5 per layer + the nonfinite marker
MAX_WATCHED_LAYERS = (protocol.MAX_METRICS_PER_POINT - 1) // 5
DEFAULT_MAX_LAYERS = 32
METRIC_PREFIX = "layers/"
NONFINITE_IN_ACTIVATIONS = 1.0
NONFINITE_IN_GRADIENTS = 2.0

_DEAD_KINDS = (nn.ReLU, nn.ReLU6)
_TANH_KINDS = (nn.Tanh, nn.Hardtanh)
_SIGMOID_KINDS = (nn.Sigmoid,)
_OTHER_ACTIVATIONS = (
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Softplus,
    nn.PReLU,
)
_SATURATION = 0.99
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")
_LONGEST_STAT = len("/saturated_fraction")

Report = Callable[[int, dict[str, float]], None]


@dataclass
class _Layer:
    index: int  # registration order in the model
    name: str  # as it appears in metric names
    module: nn.Module
    params: list[nn.Parameter]
    kind: str  # "dead" | "saturated_tanh" | "saturated_sigmoid" | "plain"
    shipped: bool = False


@dataclass
class _Sample:
    step: int
    handles: list[RemovableHandle] = field(default_factory=list)
    before: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    stats: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    forward_bad: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    backward_bad: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    grad_sq: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Readout:
    step: int
    keys: list[tuple[int, str]]
    forward_order: list[int]
    backward_order: list[int]
    values: torch.Tensor  # on the host (pinned when copied from a GPU)
    ready: torch.cuda.Event | None


def metric_name(layer: str, stat: str) -> str:
    return f"{METRIC_PREFIX}{layer}/{stat}"


def _layer_names(names: Iterable[str]) -> list[str]:
    """Module names made metric-safe and short enough, unique."""
    room = 128 - len(METRIC_PREFIX) - _LONGEST_STAT
    out: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(names):
        name = _NAME_CHARS.sub("_", raw) or "model"
        if len(name) > room:
            name = f"{i}-{name[-(room - len(str(i)) - 1) :]}"
        if name in seen:
            name = f"{name}-{i}"[-room:]
        seen.add(name)
        out.append(name)
    return out


def _kind(module: nn.Module) -> str | None:
    if isinstance(module, _DEAD_KINDS):
        return "dead"
    if isinstance(module, _TANH_KINDS):
        return "saturated_tanh"
    if isinstance(module, _SIGMOID_KINDS):
        return "saturated_sigmoid"
    if isinstance(module, _OTHER_ACTIVATIONS):
        return "plain"
    return None


def _spread(count: int, keep: int) -> set[int]:
    """``keep`` indices of ``range(count)`` spread evenly, first and last included."""
    if count <= keep:
        return set(range(count))
    if keep == 1:
        return {0}
    return {round(i * (count - 1) / (keep - 1)) for i in range(keep)}


class LayerWatch:
    """Samples layer health every ``every`` training steps; made by ``ctx.watch``.

    Args:
        model: The model (a DDP wrapper is looked through).
        every: Sample one step in ``every``.
        report: Called with ``(step, metrics)`` for each finished sample.
        max_layers: At most this many layers get their series shipped (NaN/Inf detection
            covers every layer).
        start_step: The number of the first training step (e.g. after a restore).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        every: int,
        report: Report,
        max_layers: int = DEFAULT_MAX_LAYERS,
        start_step: int = 0,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"watch(every=...) must be an int >= 1, got {every!r}")
        if not 1 <= max_layers <= MAX_WATCHED_LAYERS:
            raise ValueError(
                f"watch(max_layers=...) must be 1..{MAX_WATCHED_LAYERS} (the metrics of one "
                f"point are bounded), got {max_layers!r}"
            )
        if start_step < 0:
            raise ValueError(f"watch(start_step=...) must be >= 0, got {start_step!r}")
        self.every = every
        self._report = report
        self._root = unwrap_model(model)
        self._layers = self._find_layers(self._root, max_layers)
        if not self._layers:
            raise ValueError(
                "watch() found no layer to watch: the model has no parameters and no "
                "activation modules"
            )
        self._step = start_step
        self._sample: _Sample | None = None
        self._in_forward = False
        self._readouts: list[_Readout] = []
        self._root_handles = [
            self._root.register_forward_pre_hook(self._on_root_pre_forward),
            # always_call: a forward that raises still ends the step's hooks
            self._root.register_forward_hook(self._on_root_forward, always_call=True),
        ]

    @staticmethod
    def _find_layers(root: nn.Module, max_layers: int) -> list[_Layer]:
        found: list[tuple[str, nn.Module, list[nn.Parameter], str]] = []
        for name, module in root.named_modules():
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            kind = _kind(module)
            if params or kind is not None:
                found.append((name, module, params, kind or "plain"))
        names = _layer_names(name for name, *_ in found)
        layers = [
            _Layer(i, names[i], module, params, kind)
            for i, (_, module, params, kind) in enumerate(found)
        ]
        for i in _spread(len(layers), max_layers):
            layers[i].shipped = True
        return layers

    @property
    def layer_names(self) -> list[str]:
        """The watched layers whose series are shipped, in registration order."""
        return [layer.name for layer in self._layers if layer.shipped]

    @property
    def step(self) -> int:
        """The number the next training step will get."""
        return self._step

    # --- the hooks on the root ---

    def _on_root_pre_forward(self, module: nn.Module, args: Any) -> None:
        if self._in_forward:  # a re-entrant call of the root (rare): one step, not two
            return
        if self._sample is not None:
            self._finish_sample()
        self._ship_ready(wait=False)
        if not module.training:
            return
        step = self._step
        self._step += 1
        if step % self.every == 0:
            self._begin_sample(step)
        self._in_forward = True

    def _on_root_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._in_forward = False
        sample = self._sample
        if sample is None:
            return
        # the forward hooks served this step; the gradient hooks stay until the next step
        keep = []
        for handle in sample.handles:
            if getattr(handle, "_trainhub_forward", False):
                handle.remove()
            else:
                keep.append(handle)
        sample.handles = keep

    # --- one sample ---

    @torch.no_grad()
    def _begin_sample(self, step: int) -> None:
        sample = _Sample(step)
        for layer in self._layers:
            handle = layer.module.register_forward_hook(self._forward_hook(sample, layer))
            handle._trainhub_forward = True  # type: ignore[attr-defined]
            sample.handles.append(handle)
            if not layer.params:
                continue
            sample.stats[(layer.index, "weight_norm")] = _norm(layer.params)
            if layer.shipped:
                sample.before[layer.index] = [p.detach().clone() for p in layer.params]
            for p in layer.params:
                sample.handles.append(
                    p.register_post_accumulate_grad_hook(self._grad_hook(sample, layer))  # type: ignore[no-untyped-call]
                )
        self._sample = sample

    def _forward_hook(self, sample: _Sample, layer: _Layer) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return
            with torch.no_grad():
                out = output.detach()
                if not layer.shipped:
                    sample.forward_bad.append((layer.index, _nonfinite(out)))
                else:
                    values = out.float()
                    std, mean = (
                        torch.std_mean(values)
                        if values.numel() > 1
                        else (
                            torch.zeros((), device=values.device),
                            values.mean(),
                        )
                    )
                    # a NaN or an infinity anywhere makes the mean or the std non-finite: no
                    # second pass over the activations
                    bad = ~(torch.isfinite(mean) & torch.isfinite(std))
                    sample.forward_bad.append((layer.index, bad))
                    sample.stats[(layer.index, "act_mean")] = mean
                    sample.stats[(layer.index, "act_std")] = std
                    if layer.kind == "dead" and values.dim() >= 2:
                        # a unit: a feature, or a channel of a feature map (dim 1)
                        positive = values > 0
                        if positive.dim() > 2:
                            positive = positive.flatten(2).any(dim=2)
                        alive = positive.any(dim=0)
                        sample.stats[(layer.index, "dead_fraction")] = 1.0 - alive.float().mean()
                    elif layer.kind == "saturated_tanh":
                        flat = values.abs() > _SATURATION
                        sample.stats[(layer.index, "saturated_fraction")] = flat.float().mean()
                    elif layer.kind == "saturated_sigmoid":
                        flat = (values < 1 - _SATURATION) | (values > _SATURATION)
                        sample.stats[(layer.index, "saturated_fraction")] = flat.float().mean()
            if output.requires_grad:
                # a tensor hook that returns None observes the gradient and leaves it as it is
                def on_grad(grad: torch.Tensor) -> None:
                    with torch.no_grad():
                        sample.backward_bad.append((layer.index, _nonfinite(grad)))

                output.register_hook(on_grad)  # type: ignore[no-untyped-call]

        return hook

    def _grad_hook(self, sample: _Sample, layer: _Layer) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if param.grad is None:
                return
            with torch.no_grad():
                sq = param.grad.detach().float().pow(2).sum()
                prev = sample.grad_sq.get(layer.index)
                sample.grad_sq[layer.index] = sq if prev is None else prev + sq

        return hook

    @torch.no_grad()
    def _finish_sample(self) -> None:
        """After the optimizer step of the sampled step: measure the update, start the copy."""
        sample, self._sample = self._sample, None
        assert sample is not None
        for handle in sample.handles:
            handle.remove()
        stats = dict(sample.stats)
        for index, sq in sample.grad_sq.items():
            stats[(index, "grad_norm")] = sq.sqrt()
        for layer in self._layers:
            before = sample.before.get(layer.index)
            if before is None:
                continue
            delta_sq = sum(
                (p.detach().float() - b.float()).pow(2).sum()
                for p, b in zip(layer.params, before, strict=True)
            )
            weight = stats[(layer.index, "weight_norm")]
            stats[(layer.index, "update_ratio")] = torch.as_tensor(delta_sq).sqrt() / weight.clamp(
                min=1e-12
            )
        keys = list(stats)
        flags = [flag for _, flag in sample.forward_bad] + [flag for _, flag in sample.backward_bad]
        tensors = [stats[k].float().reshape(()) for k in keys] + [f.float() for f in flags]
        if not tensors:
            return
        device = tensors[0].device
        stacked = torch.stack([t.to(device) for t in tensors])
        ready: torch.cuda.Event | None = None
        if stacked.is_cuda:
            host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            host.copy_(stacked, non_blocking=True)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record()
        else:
            host = stacked
        self._readouts.append(
            _Readout(
                sample.step,
                keys,
                [i for i, _ in sample.forward_bad],
                [i for i, _ in sample.backward_bad],
                host,
                ready,
            )
        )

    def _ship_ready(self, *, wait: bool) -> None:
        while self._readouts:
            readout = self._readouts[0]
            if readout.ready is not None:
                if wait:
                    readout.ready.synchronize()
                elif not readout.ready.query():  # type: ignore[no-untyped-call]
                    return
            self._readouts.pop(0)
            metrics = self._metrics_of(readout)
            if metrics:
                self._report(readout.step, metrics)

    def _metrics_of(self, readout: _Readout) -> dict[str, float]:
        values: list[float] = readout.values.tolist()
        by_index = {layer.index: layer for layer in self._layers}
        metrics: dict[str, float] = {}
        for (index, stat), value in zip(readout.keys, values, strict=False):
            layer = by_index[index]
            if layer.shipped and math.isfinite(value):
                metrics[metric_name(layer.name, stat)] = value
        flags = values[len(readout.keys) :]
        n_forward = len(readout.forward_order)
        bad = _first_flagged(readout.forward_order, flags[:n_forward])
        where = NONFINITE_IN_ACTIVATIONS
        if bad is None:
            bad = _first_flagged(readout.backward_order, flags[n_forward:])
            where = NONFINITE_IN_GRADIENTS
        if bad is None:
            # a non-finite parameter gradient with finite activation gradients (rare): the
            # last such layer in forward order is the first the backward pass reached
            grads = [
                index
                for (index, stat), value in zip(readout.keys, values, strict=False)
                if stat == "grad_norm" and not math.isfinite(value)
            ]
            bad = max(grads) if grads else None
        if bad is not None:
            metrics[metric_name(by_index[bad].name, "nonfinite")] = where
        return metrics

    # --- the user's handle ---

    def flush(self) -> None:
        """Ship the last sample now (it is otherwise shipped at the next forward pass); call
        it before ``ctx.close()`` when the last steps matter."""
        if self._sample is not None and not self._in_forward:
            self._finish_sample()
        self._ship_ready(wait=True)

    def remove(self) -> None:
        """Stop watching: remove every hook (ships nothing more)."""
        for handle in self._root_handles:
            handle.remove()
        if self._sample is not None:
            for handle in self._sample.handles:
                handle.remove()
            self._sample = None
        self._readouts.clear()


def _first_flagged(order: list[int], flags: list[float]) -> int | None:
    for index, flag in zip(order, flags, strict=False):
        if flag:
            return index
    return None


def _nonfinite(t: torch.Tensor) -> torch.Tensor:
    """True (a device tensor) when ``t`` holds a NaN or an infinity: one reduction pass, its sum
    in float32 (a sum that overflows float32 is as good as infinite here)."""
    return ~torch.isfinite(t.sum(dtype=torch.float32))


def _norm(params: list[nn.Parameter]) -> torch.Tensor:
    return torch.sqrt(sum(p.detach().float().pow(2).sum() for p in params))  # type: ignore[arg-type]
