"""Pipeline and tensor parallelism: one model split over the ranks of a trial.

The spec's ``distributed.pipeline`` and ``distributed.tensor`` lay the world out as a device
mesh ``(dp, pp, tp)`` (tensor ranks adjacent, so a tensor group sits on one node when ranks are
numbered node by node). :func:`parallelize` then, on every rank:

1. cuts the model into ``pp`` consecutive stages and keeps this rank's: the layers of the
   model's pipeline stack (``pipeline_layers``, an ``nn.ModuleList``; or the children of an
   ``nn.Sequential``) outside the stage become ``nn.Identity``, the modules before the stack
   (``pipeline_first``) are kept by the first stage only and those after it
   (``pipeline_last``) by the last stage only (the others set them to None, which the model's
   forward honours). Parameter names do not change, so a checkpoint's keys are the same on
   every layout;
2. applies the tensor plan (``colwise``/``rowwise`` per Linear or Embedding name; a model's
   ``tensor_parallel_plan()`` by default) with DTensor's ``parallelize_module`` on the ``tp``
   sub-mesh;
3. wraps the stage in ``torch.distributed.pipelining.PipelineStage`` and the schedule the spec
   names (``ScheduleGPipe`` or ``Schedule1F1B``; looped schedules are not offered: they may
   hang on gloo).

The returned :class:`ParallelModel`'s :meth:`~ParallelModel.step` runs forward and backward of
one batch (micro-batched through the pipeline) and returns the batch's mean loss on every rank;
the training loop then steps its optimizer. Gradients are averaged over ``dp`` with a plain
all-reduce. Checkpoints are sharded (``torch.distributed.checkpoint``): see
:meth:`ParallelModel.state_dict` and :func:`load_sharded`.

Errors the spec and the script alone decide (a split point naming no layer, more stages than
layers, a plan naming no module) are :class:`~trainhub.runtime.errors.SpecRefused`: the trial
fails at once (exit 78) instead of being restarted.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from trainhub.distributed_contract import DistributedSpec, PipelineSchedule
from trainhub.runtime.errors import SpecRefused

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
STYLES = ("colwise", "rowwise")


@dataclass(frozen=True)
class Layout:
    """How many ranks hold copies (``dp``), stages (``pp``) and shards (``tp``) of the model."""

    dp: int
    pp: int
    tp: int

    @classmethod
    def of(cls, config: DistributedSpec, world_size: int) -> Layout:
        problem = config.layout_error(world_size)
        if problem is not None:
            field, message = problem
            raise SpecRefused(f"distributed.{field}: {message}")
        pp = config.pipeline.stages if config.pipeline is not None else 1
        return cls(world_size // (pp * config.tensor), pp, config.tensor)

    def describe(self) -> str:
        return f"dp{self.dp} x pp{self.pp} x tp{self.tp}"


# --- cutting the model into stages ---


def pipeline_layers(model: nn.Module) -> tuple[str, list[str], tuple[str, ...], tuple[str, ...]]:
    """``(stack, layer names, first-only attributes, last-only attributes)`` of a model."""
    if isinstance(model, nn.Sequential):
        return "", [name for name, _ in model.named_children()], (), ()
    stack = getattr(model, "pipeline_layers", None)
    layers = getattr(model, stack, None) if isinstance(stack, str) else None
    if not isinstance(layers, nn.ModuleList):
        raise SpecRefused(
            f"distributed.pipeline: {type(model).__name__} cannot be cut into stages: make it an "
            "nn.Sequential, or give it `pipeline_layers` (the name of its nn.ModuleList of "
            "blocks) with `pipeline_first`/`pipeline_last` and a forward that skips the ones "
            "set to None (trainhub.models.transformer does)"
        )
    assert isinstance(stack, str)
    names = [f"{stack}.{i}" for i in range(len(layers))]
    first = tuple(getattr(model, "pipeline_first", ()))
    last = tuple(getattr(model, "pipeline_last", ()))
    return stack, names, first, last


def _numel(module: nn.Module | nn.Parameter | None) -> int:
    if module is None:
        return 0
    if isinstance(module, nn.Parameter):
        return module.numel()
    return sum(p.numel() for p in module.parameters())


def stage_bounds(
    model: nn.Module, stages: int, split_points: Sequence[str] | None = None
) -> list[tuple[int, int]]:
    """``[start, end)`` of the layers of each stage: at the named layers, or of about equal
    parameter count (the first stage counting the modules before the stack, the last those
    after it).

    Raises:
        SpecRefused: more stages than layers, a split point that names no layer of the stack,
            split points out of order or of the wrong number.
    """
    _, names, first, last = pipeline_layers(model)
    if stages > len(names):
        raise SpecRefused(
            f"distributed.pipeline.stages: {stages} stages but {type(model).__name__} has "
            f"{len(names)} layer(s) to cut ({', '.join(names[:8])}); use at most {len(names)}"
        )
    if split_points:
        if len(split_points) != stages - 1:
            raise SpecRefused(
                f"distributed.pipeline.split_points: {stages} stages need {stages - 1} split "
                f"point(s); got {len(split_points)}"
            )
        starts = []
        for point in split_points:
            if point not in names:
                raise SpecRefused(
                    f"distributed.pipeline.split_points: {point!r} names no layer of "
                    f"{type(model).__name__}'s pipeline stack; its layers are "
                    f"{', '.join(names[:16])}"
                )
            starts.append(names.index(point))
        if any(b <= a for a, b in itertools.pairwise([0, *starts])):
            raise SpecRefused(
                "distributed.pipeline.split_points: the split points must name layers in order, "
                "after the first layer, each at most once"
            )
        edges = [0, *starts, len(names)]
        return list(itertools.pairwise(edges))
    sizes = [_numel(model.get_submodule(name)) for name in names]
    sizes[0] += sum(_numel(getattr(model, a, None)) for a in first)
    sizes[-1] += sum(_numel(getattr(model, a, None)) for a in last)
    total = sum(sizes)
    prefix = [sum(sizes[:i]) for i in range(len(names) + 1)]
    edges = [0]
    for k in range(1, stages):  # each cut where the running count is closest to k/stages
        target = total * k / stages
        choices = range(edges[-1] + 1, len(names) - (stages - k) + 1)
        edges.append(min(choices, key=lambda i: abs(prefix[i] - target)))
    edges.append(len(names))
    return list(itertools.pairwise(edges))


def keep_stage(model: nn.Module, stage: int, bounds: Sequence[tuple[int, int]]) -> nn.Module:
    """Turn ``model`` (in place) into stage ``stage`` of ``bounds``; names stay the same."""
    stack, names, first, last = pipeline_layers(model)
    start, end = bounds[stage]
    container = model if isinstance(model, nn.Sequential) else model.get_submodule(stack)
    for index, name in enumerate(names):
        if not start <= index < end:
            container.register_module(name.rsplit(".", 1)[-1], nn.Identity())
    if stage != 0:
        for attribute in first:
            setattr(model, attribute, None)
    if stage != len(bounds) - 1:
        for attribute in last:
            setattr(model, attribute, None)
    return model


# --- tensor parallelism ---


def tensor_plan(
    model: nn.Module, plan: Mapping[str, Any] | None, tensor: int = 1
) -> dict[str, Any]:
    """The plan to apply: ``plan``, or the model's ``tensor_parallel_plan()`` (given the
    tensor degree where it takes one: ``tensor_parallel_plan(tensor)``)."""
    if plan is None:
        maker = getattr(model, "tensor_parallel_plan", None)
        if not callable(maker):
            raise SpecRefused(
                f"distributed.tensor: {type(model).__name__} has no tensor-parallel plan; pass "
                "tp_plan={'layer.name': 'colwise' | 'rowwise', ...} to ctx.parallelize, or give "
                "the model a tensor_parallel_plan() method"
            )
        takes_degree = bool(inspect.signature(maker).parameters)
        plan = maker(tensor) if takes_degree else maker()
    return dict(plan)


def check_plan(model: nn.Module, plan: Mapping[str, Any], tp: int) -> None:
    """Every entry names a Linear/Embedding of ``model`` whose split dimension divides by
    ``tp``; raises SpecRefused otherwise."""
    modules = dict(model.named_modules())
    for name, style in plan.items():
        module = modules.get(name)
        if module is None:
            raise SpecRefused(f"distributed.tensor: the tensor plan names {name!r}, no module")
        if isinstance(style, str) and style not in STYLES:
            raise SpecRefused(
                f"distributed.tensor: the plan's style for {name!r} must be one of "
                f"{', '.join(STYLES)}; got {style!r}"
            )
        if isinstance(module, nn.Linear):
            size = module.out_features if style == "colwise" else module.in_features
        elif isinstance(module, nn.Embedding):
            size = module.embedding_dim if style == "rowwise" else module.num_embeddings
        else:
            if isinstance(style, str):
                raise SpecRefused(
                    f"distributed.tensor: {name!r} is a {type(module).__name__}; the plan "
                    "shards nn.Linear and nn.Embedding layers"
                )
            continue
        if size % tp:
            raise SpecRefused(
                f"distributed.tensor: {name!r} ({type(module).__name__}) splits a dimension of "
                f"{size}, which does not divide by tensor={tp}"
            )


def apply_tensor_parallel(module: nn.Module, mesh: Any, plan: Mapping[str, Any]) -> None:
    """DTensor tensor parallelism of the entries of ``plan`` this module still holds."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    present = {name for name, m in module.named_modules() if not isinstance(m, nn.Identity)}
    styles: dict[str, ParallelStyle] = {}
    for name, style in plan.items():
        if name not in present:
            continue  # another stage's layer
        if isinstance(style, str):
            styles[name] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
        else:
            styles[name] = style
    if styles:
        parallelize_module(module, mesh, styles)


# --- where the time goes ---

_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "broadcast",
        "wait_tensor",
    }
)


class TensorCommTimer(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Times the collectives DTensor issues (tensor-parallel communication), forward and
    backward. DTensor desugars its ops into ``_c10d_functional`` collectives; returning
    NotImplemented for DTensor arguments lets it do so before this mode sees them (as
    ``CommDebugMode`` does)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seconds = 0.0
        self.calls = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        from torch.distributed.tensor import DTensor

        if any(t is DTensor or issubclass(t, DTensor) for t in types):
            return NotImplemented
        namespace = getattr(func, "namespace", "")
        name = func._opname if hasattr(func, "_opname") else ""
        if namespace in ("_c10d_functional", "c10d") and name in _COLLECTIVES:
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            self.seconds += time.perf_counter() - start
            self.calls += 1
            return out
        return func(*args, **(kwargs or {}))


@dataclass
class ParallelTimes:
    """Cumulative seconds of this rank: steps, stage compute, tensor-parallel communication;
    and of the compute, its micro-batch forwards and backwards (with their counts)."""

    step_s: float = 0.0
    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    steps: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    forwards: int = 0
    backwards: int = 0

    @property
    def bubble_s(self) -> float:
        """Time in steps not spent computing this rank's stage: the pipeline bubble, and the
        point-to-point transfers between stages."""
        return max(0.0, self.step_s - self.compute_s)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def chunk_s(self) -> tuple[float, float]:
        """Mean seconds of one micro-batch's forward (with its loss on the last stage) and
        one backward on this rank."""
        return (
            self.forward_s / self.forwards if self.forwards else 0.0,
            self.backward_s / self.backwards if self.backwards else 0.0,
        )


def one_f_one_b_bubble(chunk_s: Sequence[tuple[float, float]], microbatches: int) -> list[float]:
    """Each stage's bubble fraction under ``Schedule1F1B`` with these per-stage micro-batch
    ``(forward, backward)`` seconds when passing activations and gradients costs nothing: the
    schedule's own idle time (its warm-up and cool-down, and waiting on a slower stage).

    The order is torch's: stage ``s`` runs ``min(m, p - s)`` forwards, then a backward and a
    forward in turn, then the remaining backwards; a forward waits on the previous stage's
    forward of its micro-batch, a backward on the next stage's backward. The step ends when
    the last stage to finish does (every rank then meets in the loss all-reduce). With equal
    stages it is ``(p - 1) / (m + p - 1)``.
    """
    p, m = len(chunk_s), microbatches
    orders: list[list[tuple[str, int]]] = []
    for s in range(p):
        warmup = min(m, p - s)
        order = [("F", i) for i in range(warmup)]
        for i in range(m):
            order.append(("B", i))
            if warmup + i < m:
                order.append(("F", warmup + i))
        orders.append(order)
    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * p
    position = [0] * p
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                need = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i)
                if (kind == "F" and s == 0) or (kind == "B" and s == p - 1):
                    ready = 0.0
                elif need in done:
                    ready = done[need]
                else:
                    break
                forward, backward = chunk_s[s]
                clock[s] = max(clock[s], ready) + (forward if kind == "F" else backward)
                done[(kind, s, i)] = clock[s]
                position[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the order above cannot deadlock
            raise RuntimeError("1F1B simulation made no progress")
    end = max(clock)
    if end <= 0:
        return [0.0] * p
    return [1 - m * (forward + backward) / end for forward, backward in chunk_s]


# --- the model ---


class ParallelModel:
    """This rank's part of a model split by :func:`parallelize`.

    Attributes:
        module: this rank's stage (with DTensor parameters where tensor-parallel); its
            parameters are what the optimizer steps, its names those of the whole model.
        layout: dp x pp x tp.
        mesh: the ``(dp, pp, tp)`` device mesh.
        stage: this rank's pipeline stage (0 without a pipeline).
        times: cumulative time of steps, stage compute and tensor-parallel communication.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        layout: Layout,
        mesh: Any,
        stage: int,
        loss_fn: LossFn,
        microbatches: int,
        schedule: PipelineSchedule,
        device: torch.device,
    ) -> None:
        self.module = module
        self.layout = layout
        self.mesh = mesh
        self.stage = stage
        self.loss_fn = loss_fn
        self.microbatches = microbatches if layout.pp > 1 else 1
        self.device = device
        self.times = ParallelTimes()
        self._comm = TensorCommTimer() if layout.tp > 1 else None
        self._schedule: Any = None
        if layout.pp > 1:
            self._schedule = self._make_schedule(schedule)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.layout.pp - 1

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters()

    def _make_schedule(self, schedule: PipelineSchedule) -> Any:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = PipelineStage(
            self.module,
            self.stage,
            self.layout.pp,
            self.device,
            group=self.mesh["pp"].get_group(),
        )
        # time this stage's own compute (its forwards, the last stage's loss, its backwards);
        # the rest of a step is bubble and transfers
        stage.forward_one_chunk = self._timed(stage.forward_one_chunk, "forward")  # type: ignore[method-assign]
        stage.backward_one_chunk = self._timed(stage.backward_one_chunk, "backward")  # type: ignore[method-assign]
        kind = ScheduleGPipe if schedule is PipelineSchedule.GPIPE else Schedule1F1B
        # each micro-batch's loss is divided by their number here, in the loss its backward
        # starts from, rather than every gradient afterwards (scale_grads=True: one more pass
        # over all gradients at the end of the step, while the other stages wait)
        return kind(
            stage,
            self.microbatches,
            loss_fn=self._timed(self._microbatch_loss, "loss"),
            scale_grads=False,
        )

    def _microbatch_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, target) / self.microbatches

    def _timed(self, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                times = self.times
                times.compute_s += seconds
                if kind == "backward":
                    times.backward_s += seconds
                    times.backwards += 1
                else:  # a loss belongs to its micro-batch's forward
                    times.forward_s += seconds
                    times.forwards += kind == "forward"

        return timed

    @contextmanager
    def _tensor_comm(self) -> Iterator[None]:
        if self._comm is None:
            yield
            return
        before = self._comm.seconds
        with self._comm:
            yield
        self.times.tp_comm_s += self._comm.seconds - before

    def step(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch on every rank; the batch's mean loss, on every
        rank (a 0-d tensor). The gradients are then in the stage's parameters, averaged over
        the data-parallel ranks: step the optimizer next. Every rank of the trial calls it with
        its batch (the same on the ranks of one model replica; a ``ctx.prepare_data_loader``
        of the data-parallel shard, see :meth:`data_rank`).
        """
        if self.layout.pp > 1 and inputs.shape[0] % self.microbatches:
            raise ValueError(
                f"a batch of {inputs.shape[0]} does not cut into {self.microbatches} equal "
                "micro-batches (distributed.pipeline.microbatches); use a batch size that "
                "divides by it"
            )
        inputs, target = inputs.to(self.device), target.to(self.device)
        start = time.perf_counter()
        with self._tensor_comm():
            if self._schedule is None:
                compute_start = time.perf_counter()
                loss = self.loss_fn(self.module(inputs), target)
                loss.backward()  # type: ignore[no-untyped-call]
                self.times.compute_s += time.perf_counter() - compute_start
                value = loss.detach()
            else:
                value = self._pipeline_step(inputs, target)
        if self.layout.dp > 1:
            self._average_gradients()
            value = value.clone()
            dist.all_reduce(value, group=self.mesh["dp"].get_group())
            value /= self.layout.dp
        self.times.step_s += time.perf_counter() - start
        self.times.steps += 1
        return value

    def _pipeline_step(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        last_target = target if self.is_last else None
        if self.is_first:
            self._schedule.step(inputs, target=last_target, losses=losses)
        else:
            self._schedule.step(target=last_target, losses=losses)
        # the micro-batches' losses, each divided by their number: their sum is the mean
        value = (
            torch.stack([x.detach() for x in losses]).sum()
            if losses
            else torch.zeros((), device=self.device)
        )
        # the loss lives on the last stage: share it with the others
        dist.all_reduce(value, group=self.mesh["pp"].get_group())
        return value

    def _average_gradients(self) -> None:
        from torch.distributed.tensor import DTensor

        group = self.mesh["dp"].get_group()
        for param in self.module.parameters():
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=group)
            grad /= self.layout.dp

    def data_rank(self) -> tuple[int, int]:
        """``(rank, world size)`` of the data-parallel shard this rank reads."""
        return self.mesh["dp"].get_local_rank(), self.layout.dp

    def time_summary(self, *, reset: bool = True) -> dict[str, float]:
        """This rank's ``time/bubble_share`` and ``time/tp_comm_share`` of the step time."""
        t = self.times
        out = {
            "time/bubble_share": t.bubble_fraction,
            "time/tp_comm_share": t.tp_comm_s / t.step_s if t.step_s > 0 else 0.0,
        }
        if reset:
            self.times = ParallelTimes()
        return out

    # --- checkpoints ---

    def state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}`` of this rank's stage, keyed by the whole
        model's parameter names (DTensors where tensor-parallel): what
        ``ctx.save_checkpoint`` writes sharded, each rank its own part."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        state: dict[str, Any] = {"model": get_model_state_dict(self.module)}
        if optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(
                self.module,
                optimizer,
                options=StateDictOptions(flatten_optimizer_state_dict=True),
            )
        return state

    def load_state_dict(
        self, state: Mapping[str, Any], optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Load what :meth:`state_dict` (of this layout) holds into the stage and optimizer."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        set_model_state_dict(self.module, dict(state["model"]))
        if optimizer is not None and "optimizer" in state:
            set_optimizer_state_dict(
                self.module,
                optimizer,
                dict(state["optimizer"]),
                options=StateDictOptions(flatten_optimizer_state_dict=True),
            )


def load_sharded(
    folder: str | Path,
    parallel: ParallelModel,
    optimizers: Sequence[torch.optim.Optimizer] = (),
) -> dict[str, Any]:
    """Read a checkpoint saved with ``torch.distributed.checkpoint`` from :meth:`state_dict`
    plus plain top-level values (``{"model", "optimizer", "step", ...}``), onto this layout:
    each rank reads the parts of the entries its stage holds, re-sharded as its DTensors are
    now (a pp2 x tp2 checkpoint loads onto pp4 x tp1). Loads them into the stage and the
    optimizer, and returns the whole state (other values as saved)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    reader = FileSystemReader(str(folder))
    metadata = reader.read_metadata()
    optimizer = optimizers[-1] if optimizers else None
    state: dict[str, Any] = parallel.state_dict(optimizer)
    for key, meta in metadata.state_dict_metadata.items():
        top = key.split(".", 1)[0]
        if top in ("model", "optimizer") or "." in key:
            continue
        if isinstance(meta, TensorStorageMetadata):
            state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        else:
            state[key] = None
    load(state, storage_reader=reader)
    parallel.load_state_dict(state, optimizer)
    return state


# --- the entry point ---


def parallelize(
    model: nn.Module,
    config: DistributedSpec,
    *,
    device: torch.device | str,
    loss_fn: LossFn,
    split_points: Sequence[str] | None = None,
    tp_plan: Mapping[str, Any] | None = None,
) -> ParallelModel:
    """Split ``model`` over the trial's ranks as ``config`` (``pipeline``, ``tensor``) says.

    Call on every rank, after ``torch.distributed`` is initialised, with the same model (same
    initial weights: seed before building it). ``split_points`` and ``tp_plan`` replace the
    spec's split points and the model's own plan.

    Raises:
        SpecRefused: the spec and the model do not fit each other (see the module docstring).
    """
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    layout = Layout.of(config, world)
    pipeline = config.pipeline
    points = split_points
    if points is None and pipeline is not None:
        points = pipeline.split_points
    plan: dict[str, Any] = {}
    if layout.tp > 1:
        plan = tensor_plan(model, tp_plan, layout.tp)
        check_plan(model, plan, layout.tp)
    bounds = stage_bounds(model, layout.pp, points) if layout.pp > 1 else [(0, 0)]
    if world == 1 and not dist.is_initialized():
        return ParallelModel(
            model.to(device),
            layout=layout,
            mesh=None,
            stage=0,
            loss_fn=loss_fn,
            microbatches=1,
            schedule=PipelineSchedule.GPIPE,
            device=device,
        )
    mesh = init_device_mesh(
        device.type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=("dp", "pp", "tp")
    )
    stage = mesh["pp"].get_local_rank()
    if layout.pp > 1:
        keep_stage(model, stage, bounds)
    model = model.to(device)
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], plan)
    return ParallelModel(
        model,
        layout=layout,
        mesh=mesh,
        stage=stage,
        loss_fn=loss_fn,
        microbatches=pipeline.microbatches if pipeline is not None else 1,
        schedule=pipeline.schedule if pipeline is not None else PipelineSchedule.ONE_F_ONE_B,
        device=device,
    )
