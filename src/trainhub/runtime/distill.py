"""Knowledge distillation: soft targets (Hinton et al. 2015) and FitNet hints (Romero et al. 2015).

A script gets a :class:`Distiller` from ``ctx.distiller(model)``: the teacher named in the spec's
``distill`` section (or given as an argument) runs in eval mode without gradients on this rank's
device, on this rank's batch, so distillation is data-parallel exactly like the student::

    model = ctx.prepare_model(Student())
    distiller = ctx.distiller(model, Teacher())      # weights from distill.teacher
    optimizer = torch.optim.SGD([*model.parameters(), *distiller.parameters()], lr=0.05)
    for x, y in loader:
        logits = model(x)                             # hooks keep the hinted student features
        loss = distiller.loss(x, logits, y)          # runs the teacher on x
        optimizer.zero_grad(); loss.backward(); optimizer.step()

The loss is ``alpha * KL(softmax(t/T) || softmax(s/T)) * T^2 + (1 - alpha) * CE(s, y)`` plus
``hint_weight`` times the mean squared error between each adapted student feature and its
teacher feature. Adapters (a 1x1 convolution for feature maps, a linear map for vectors) are
learned: give :meth:`Distiller.parameters` to the optimizer. With several ranks the adapters are
wrapped in DDP, so their gradients are averaged like the student's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from trainhub.distill_contract import DistillSpec, TeacherRef
from trainhub.runtime import protocol
from trainhub.runtime.model import unwrap_model

__all__ = [
    "Distiller",
    "TeacherError",
    "TeacherUnreachable",
    "distillation_loss",
    "fetch_model_weights",
    "fetch_teacher_weights",
    "kd_loss",
    "load_weights",
]

Weights = str | Path | bytes | Mapping[str, Any]


class TeacherError(ValueError):
    """The teacher cannot be built or loaded; the message says what to give instead."""


class TeacherUnreachable(TeacherError):
    """The control plane could not be reached for the teacher's weights (worth another try)."""

    transient = True


def kd_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``KL(softmax(t/T) || softmax(s/T)) * T^2``, averaged over the batch.

    The ``T^2`` keeps the gradients' scale independent of ``T`` (Hinton et al., sec. 2).
    """
    log_student = F.log_softmax(student_logits / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)
    kl = F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True)
    return kl * temperature * temperature


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    alpha: float,
) -> torch.Tensor:
    """``alpha * kd_loss + (1 - alpha) * cross_entropy(student, targets)``."""
    soft = kd_loss(student_logits, teacher_logits, temperature)
    hard = F.cross_entropy(student_logits, targets)
    return alpha * soft + (1 - alpha) * hard


@dataclass(frozen=True)
class _Shape:
    channels: int
    spatial: bool  # a (N, C, H, W) feature map, else (N, C)


class _Adapters(nn.Module):
    """One learned map per hint from the student's feature to the teacher's."""

    def __init__(self, pairs: Sequence[tuple[_Shape, _Shape]]) -> None:
        super().__init__()
        maps: list[nn.Module] = []
        for student, teacher in pairs:
            if teacher.spatial:
                maps.append(nn.Conv2d(student.channels, teacher.channels, 1, bias=False))
            else:
                maps.append(nn.Linear(student.channels, teacher.channels, bias=False))
        self.maps = nn.ModuleList(maps)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for adapter, feature in zip(self.maps, features, strict=True):
            # a map hinted by a vector: pool it first
            pooled = (
                feature.mean(dim=(2, 3))
                if feature.dim() == 4 and isinstance(adapter, nn.Linear)
                else feature
            )
            out.append(adapter(pooled))
        return out


class Distiller:
    """A teacher, its soft targets and hints, for one student (see the module docstring).

    Args:
        student: The student (a DDP-wrapped model is fine; hooks go on the inner module).
        teacher: The teacher, already holding its weights; moved to ``device``, put in eval
            mode, its parameters frozen.
        temperature, alpha, hint_weight: See :class:`~trainhub.distill_contract.DistillSpec`.
        hints: ``(student_layer, teacher_layer)`` module paths.
        device: Where the teacher and the adapters live (the student's device).
        example_input: A batch to read the hinted features' shapes from; without it they are
            read from the layers (the last Linear, Conv2d or BatchNorm inside each).
    """

    def __init__(
        self,
        student: nn.Module,
        teacher: nn.Module,
        *,
        temperature: float = 4.0,
        alpha: float = 0.9,
        hints: Sequence[tuple[str, str]] = (),
        hint_weight: float = 1.0,
        device: torch.device | str | None = None,
        example_input: torch.Tensor | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0; got {temperature}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must lie in [0, 1]; got {alpha}")
        inner = unwrap_model(student)
        self.device = torch.device(device) if device is not None else _device_of(inner)
        self.teacher = teacher.to(self.device).eval().requires_grad_(False)
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.hint_weight = float(hint_weight)
        self.hints = [(str(s), str(t)) for s, t in hints]
        self._student_features: dict[str, torch.Tensor] = {}
        self._teacher_features: dict[str, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        for student_layer, teacher_layer in self.hints:
            self._hook(inner, student_layer, self._student_features, "student")
            self._hook(self.teacher, teacher_layer, self._teacher_features, "teacher")
        shapes = self._shapes(inner, example_input)
        self.adapters = _Adapters(shapes).to(self.device)
        self._run_adapters: nn.Module = self.adapters
        if (
            self.hints
            and dist.is_available()
            and dist.is_initialized()
            and (dist.get_world_size() > 1)
        ):
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._run_adapters = DistributedDataParallel(self.adapters, device_ids=ids)
        #: the last step's terms (detached): soft, hard, hints
        self.last_terms: dict[str, torch.Tensor] = {}

    def parameters(self) -> Iterator[nn.Parameter]:
        """The adapters' parameters: add them to the optimizer (the teacher has none to train)."""
        return self.adapters.parameters()

    @torch.no_grad()
    def teacher_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.teacher(inputs)
        return out

    def loss(
        self, inputs: torch.Tensor, student_logits: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """The distillation loss of one batch, after the student's forward on ``inputs``.

        Every rank calls it on its own batch; with hints and several ranks it is a collective
        (the adapters' DDP), like the student's backward.
        """
        teacher_logits = self.teacher_logits(inputs)
        soft = kd_loss(student_logits, teacher_logits, self.temperature)
        hard = F.cross_entropy(student_logits, targets)
        total = self.alpha * soft + (1 - self.alpha) * hard
        terms = {"soft": soft.detach(), "hard": hard.detach()}
        if self.hints:
            hint = self._hint_loss()
            total = total + self.hint_weight * hint
            terms["hints"] = hint.detach()
        self.last_terms = terms
        return total

    def close(self) -> None:
        """Remove the forward hooks (the student then runs as if never distilled)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hint_loss(self) -> torch.Tensor:
        missing = [s for s, _ in self.hints if s not in self._student_features]
        if missing:
            raise RuntimeError(
                f"no student features for hint layer(s) {', '.join(missing)}: call the student "
                "on the batch before distiller.loss"
            )
        student = [self._student_features[s] for s, _ in self.hints]
        teacher = [self._teacher_features[t] for _, t in self.hints]
        adapted: list[torch.Tensor] = self._run_adapters(student)
        losses = []
        for s, t in zip(adapted, teacher, strict=True):
            if s.dim() == 4 and s.shape[-2:] != t.shape[-2:]:  # pool to the teacher's map size
                size = (int(t.shape[-2]), int(t.shape[-1]))
                losses.append(F.mse_loss(F.adaptive_avg_pool2d(s, size), t))
            else:
                losses.append(F.mse_loss(s, t))
        self._student_features.clear()
        return torch.stack(losses).sum()

    def _hook(
        self, model: nn.Module, layer: str, store: dict[str, torch.Tensor], which: str
    ) -> None:
        try:
            module = model.get_submodule(layer)
        except AttributeError:
            raise ValueError(f"distill.hints: the {which} has no layer named {layer!r}") from None

        def keep(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                store[layer] = output

        self._handles.append(module.register_forward_hook(keep))

    def _shapes(
        self, student: nn.Module, example_input: torch.Tensor | None
    ) -> list[tuple[_Shape, _Shape]]:
        if not self.hints:
            return []
        if example_input is not None:
            was_training = student.training
            student.eval()
            with torch.no_grad():
                student(example_input.to(self.device))
                self.teacher(example_input.to(self.device))
            student.train(was_training)
            pairs = [
                (_shape_of(self._student_features[s]), _shape_of(self._teacher_features[t]))
                for s, t in self.hints
            ]
            self._student_features.clear()
            self._teacher_features.clear()
        else:
            pairs = [
                (_layer_shape(student, s, "student"), _layer_shape(self.teacher, t, "teacher"))
                for s, t in self.hints
            ]
        for (student_layer, teacher_layer), (s, t) in zip(self.hints, pairs, strict=True):
            if t.spatial and not s.spatial:
                raise ValueError(
                    f"distill.hints: the student's {student_layer} gives vectors but the "
                    f"teacher's {teacher_layer} gives feature maps; hint a map with a map"
                )
        return pairs


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _shape_of(feature: torch.Tensor) -> _Shape:
    if feature.dim() not in (2, 4):
        raise ValueError(f"distill.hints: features of {feature.dim()} dimensions cannot be hinted")
    return _Shape(feature.shape[1], feature.dim() == 4)


def _layer_shape(model: nn.Module, layer: str, which: str) -> _Shape:
    module = model.get_submodule(layer)
    last: nn.Module | None = None
    for candidate in module.modules():
        if isinstance(candidate, nn.Linear | nn.Conv2d | nn.BatchNorm1d | nn.BatchNorm2d):
            last = candidate
    if isinstance(last, nn.Linear):
        return _Shape(last.out_features, False)
    if isinstance(last, nn.Conv2d):
        return _Shape(last.out_channels, True)
    if isinstance(last, nn.BatchNorm1d | nn.BatchNorm2d):
        return _Shape(last.num_features, isinstance(last, nn.BatchNorm2d))
    raise ValueError(
        f"distill.hints: cannot tell the width of the {which}'s {layer!r} "
        f"({type(module).__name__}); pass example_input to read it from a batch"
    )


# ---- teacher weights ---------------------------------------------------------------------------


def load_weights(teacher: nn.Module | None, weights: Weights) -> nn.Module:
    """Load ``weights`` (a path, bytes, a state dict or a checkpoint dict) into ``teacher``.

    A checkpoint dict may hold the state dict under ``model`` or ``state_dict``, and the
    architecture under ``architecture: {name, kwargs}`` (a zoo model), used when ``teacher`` is
    None. Keys saved from a DDP model (``module.``) load too.
    """
    payload: Any = weights
    if isinstance(weights, str | Path):
        path = Path(weights)
        if not path.is_file():
            raise TeacherError(f"teacher weights {str(path)!r}: no such file")
        payload = torch.load(path, map_location="cpu", weights_only=True)
    elif isinstance(weights, bytes):
        payload = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    if not isinstance(payload, Mapping):
        raise TeacherError(f"teacher weights: expected a state dict, got {type(payload).__name__}")
    if teacher is None:
        teacher = _build_architecture(payload.get("architecture"))
    state = payload
    for key in ("model", "state_dict"):
        if isinstance(payload.get(key), Mapping):
            state = payload[key]
            break
    state = {str(k).removeprefix("module."): v for k, v in state.items()}
    try:
        teacher.load_state_dict(state)
    except RuntimeError as exc:
        raise TeacherError(
            f"the teacher's weights do not fit its architecture: {str(exc).splitlines()[0]} "
            "(build the teacher the way it was trained)"
        ) from None
    return teacher


def _build_architecture(architecture: Any) -> nn.Module:
    if not isinstance(architecture, Mapping) or "name" not in architecture:
        raise TeacherError(
            "the teacher's weights do not say which architecture they belong to: pass the "
            "teacher module, e.g. ctx.distiller(model, Teacher())"
        )
    from trainhub import models

    kwargs = architecture.get("kwargs") or {}
    return models.create(str(architecture["name"]), **dict(kwargs))


def fetch_model_weights(
    api_url: str, token: str | None, name: str, version: int | None, timeout_s: float = 300.0
) -> bytes:
    """The weights of a registered model version, with a user's token (notebooks, benchmarks).

    ``GET /api/v1/models/{name}/versions/{version|latest}/file`` (the model registry's route).
    A trial fetches its teacher with :func:`fetch_teacher_weights` instead: its token reaches
    only its own trial.
    """
    which = "latest" if version is None else str(version)
    path = f"{protocol.API_PREFIX}/models/{name}/versions/{which}/file"
    return _get(api_url, token, path, f"teacher {name}:{which}", timeout_s)


def fetch_teacher_weights(
    api_url: str, token: str | None, trial_id: int, ref: TeacherRef, timeout_s: float = 300.0
) -> bytes:
    """The weights of the teacher trial ``trial_id``'s spec names, through the trial's route.

    ``GET /api/v1/trials/{trial_id}/teacher-weights``: the control plane resolves
    ``distill.teacher`` (a trial of the same tenant, or a registered model version the tenant
    may read), so the trial's token needs no access beyond its own trial.
    """
    return _get(
        api_url, token, protocol.teacher_weights_path(trial_id), f"teacher {ref}", timeout_s
    )


def _get(api_url: str, token: str | None, path: str, what: str, timeout_s: float) -> bytes:
    import tempfile

    from trainhub.runtime import direct_storage

    with tempfile.TemporaryDirectory(prefix="trainhub-teacher-") as folder:
        fetched = Path(folder) / "weights.pt"
        if direct_storage.fetch_if_direct(api_url, token, path + "/direct", fetched, timeout_s):
            return fetched.read_bytes()  # straight from the bucket (--rank-storage direct)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(api_url + path, headers=headers, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise TeacherUnreachable(f"{what}: the control plane cannot be reached ({exc})") from None
    if response.status_code >= 400:
        try:
            said = str(response.json().get("message", ""))
        except ValueError:
            said = ""
        said = f" ({said})" if said else ""
        if response.status_code == 404:
            raise TeacherError(
                f"{what} does not exist or this trial may not read it{said}: name a trial of "
                "this tenant with a checkpoint, or a registered model shared with it"
            )
        raise TeacherError(f"{what}: the control plane answered {response.status_code}{said}")
    return response.content


def teacher_weights(
    ref: TeacherRef, api_url: str | None, token: str | None, trial_id: int | None
) -> bytes:
    """Fetch the weights ``distill.teacher`` names (managed trials only)."""
    if api_url is None or trial_id is None:
        raise TeacherError(
            f"distill.teacher {ref}: a standalone run cannot fetch it; pass weights= (a path or "
            "a state dict) to ctx.distiller"
        )
    return fetch_teacher_weights(api_url, token, trial_id, ref)


def make_distiller(
    student: nn.Module,
    teacher: nn.Module | None,
    *,
    weights: Weights | None,
    spec: DistillSpec | None,
    api_url: str | None,
    token: str | None,
    trial_id: int | None,
    device: torch.device,
    example_input: torch.Tensor | None = None,
    **overrides: Any,
) -> Distiller:
    """A :class:`Distiller` from the spec's section, the script's arguments winning."""
    if weights is not None:
        teacher = load_weights(teacher, weights)
    elif spec is not None:
        teacher = load_weights(teacher, teacher_weights(spec.teacher_ref, api_url, token, trial_id))
    elif teacher is None:
        raise TeacherError(
            "no teacher: the spec has no distill section and none was given; pass the teacher "
            "module (and weights=) to ctx.distiller"
        )
    settings: dict[str, Any] = {}
    if spec is not None:
        settings = {
            "temperature": spec.temperature,
            "alpha": spec.alpha,
            "hint_weight": spec.hint_weight,
            "hints": [(h.student, h.teacher) for h in spec.hints],
        }
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return Distiller(student, teacher, device=device, example_input=example_input, **settings)
