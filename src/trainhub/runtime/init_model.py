"""Start a script's model from registered weights: load by name and shape, grow, reset, freeze.

``ctx.init_model(model)`` (every rank, before ``prepare_model``) does, in this order:

1. load: the weights the spec's ``model.init_from`` names (downloaded with the trial's token
   from ``GET /api/v1/trials/{id}/init-weights``, once per node) are copied into every
   tensor of ``model.state_dict()`` with the same name and shape. Tensors whose name matches
   a ``reset`` pattern are not loaded. A tensor of the same name and another shape outside
   ``reset`` is an error naming every such tensor: a silent skip would train a half-random
   model;
2. grow: Net2Net (``trainhub.models.net2net``) widens or deepens the named layers, keeping the
   function (``grow: {wider: {fc1: 2.0}, deeper: [conv2]}``);
3. reset: modules whose parameters match a ``reset`` pattern are re-initialised
   (``reset_parameters()``);
4. freeze: parameters matching a ``freeze`` pattern get ``requires_grad = False``.

Patterns are globs on parameter names (``features.*``, ``classifier.4.weight``); a pattern
that matches nothing is an error (a typo would otherwise train what was meant to be frozen).
Checkpoint files are read as saved by ``ctx.save_checkpoint``: the state dict is the
``"model"`` entry (or ``"state_dict"``, or the file itself when it holds only tensors); the
``module.`` prefix of DDP and ``_orig_mod.`` of ``torch.compile`` are dropped.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainhub.runtime import protocol

logger = logging.getLogger("trainhub.runtime")

_PREFIXES = ("module.", "_orig_mod.")
_STATE_KEYS = ("model", "state_dict", "model_state_dict")


@dataclass(frozen=True)
class ModelPlan:
    """What to do to the model (the spec's ``model`` section, or the arguments)."""

    init_from: str | Path | Mapping[str, torch.Tensor] | None = None
    freeze: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()
    grow: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelPlan:
        raw = (os.environ if environ is None else environ).get(protocol.ENV_MODEL, "")
        if not raw.strip():
            return cls()
        try:
            section = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{protocol.ENV_MODEL} is not JSON: {exc}") from None
        return cls(
            init_from=section.get("init_from"),
            freeze=tuple(section.get("freeze") or ()),
            reset=tuple(section.get("reset") or ()),
            grow=section.get("grow") or {},
        )


@dataclass(frozen=True)
class InitReport:
    """What ``init_model`` did; ``str(report)`` is one line per kind."""

    source: str | None
    matched: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # in the model, not in the weights: left as initialised
    unexpected: tuple[str, ...] = ()  # in the weights, not in the model: ignored
    grown: tuple[str, ...] = ()

    def __str__(self) -> str:
        def names(items: Sequence[str]) -> str:
            shown = ", ".join(items[:8])
            return f"{len(items)}" + (
                f" ({shown}{', ...' if len(items) > 8 else ''})" if items else ""
            )

        return (
            f"init_model from {self.source or 'nothing'}: matched {names(self.matched)}; "
            f"reset {names(self.reset)}; frozen {names(self.frozen)}; missing "
            f"{names(self.missing)}; unexpected {names(self.unexpected)}; grown {names(self.grown)}"
        )


def extract_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    """The model's tensors in a loaded checkpoint (see the module docstring)."""
    if isinstance(obj, Mapping):
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return {_strip(str(k)): v for k, v in obj.items()}
        for key in _STATE_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and inner:
                return extract_state_dict(inner)
        keys = ", ".join(map(str, list(obj)[:10]))
        raise ValueError(
            f"no model weights in the checkpoint (its keys: {keys}); save them as "
            "ctx.save_checkpoint({'model': model.state_dict(), ...})"
        )
    raise ValueError(f"a checkpoint holds a dict of state, not {type(obj).__name__}")


def _strip(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(name, p) or fnmatchcase(name, p + ".*") for p in patterns)


def _check_patterns(patterns: Sequence[str], names: Sequence[str], field_name: str) -> None:
    for pattern in patterns:
        if not any(_matches(n, [pattern]) for n in names):
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"model.{field_name}: {pattern!r} matches no parameter of the model{hint} "
                f"(names look like {', '.join(names[:4])})"
            )


def load_matching(
    model: nn.Module, weights: Mapping[str, torch.Tensor], reset: Sequence[str] = ()
) -> tuple[list[str], list[str], list[str]]:
    """Copy tensors of the same name and shape into ``model``; (matched, missing, unexpected).

    Raises:
        ValueError: a tensor outside ``reset`` has another shape (every one is named).
    """
    own = model.state_dict()
    matched, missing, mismatched = [], [], []
    update: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        if _matches(name, reset):
            continue
        source = weights.get(name)
        if source is None:
            missing.append(name)
        elif tuple(source.shape) != tuple(tensor.shape):
            mismatched.append(
                f"{name}: weights {tuple(source.shape)} vs model {tuple(tensor.shape)}"
            )
        else:
            update[name] = source.to(dtype=tensor.dtype)
            matched.append(name)
    if mismatched:
        heads = sorted({m.split(":")[0].rsplit(".", 1)[0] + ".*" for m in mismatched})
        raise ValueError(
            f"init_model: {len(mismatched)} tensor(s) have another shape than in the weights "
            f"and are not in model.reset: {'; '.join(mismatched)}. Add them to model.reset "
            f"(e.g. reset: [{', '.join(repr(h) for h in heads)}]) to start them fresh"
        )
    model.load_state_dict(update, strict=False)
    unexpected = sorted(n for n in weights if n not in own and not _matches(n, reset))
    return matched, missing, unexpected


def _reset(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    names = [n for n, _ in model.named_parameters() if _matches(n, patterns)]
    chosen = set(names)
    for prefix, module in model.named_modules():
        own = [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]
        if own and any(n in chosen for n in own):
            reset_parameters = getattr(module, "reset_parameters", None)
            if callable(reset_parameters):
                reset_parameters()
    return names


def _grow(model: nn.Module, grow: Mapping[str, Any]) -> tuple[nn.Module, list[str]]:
    if not grow or not (grow.get("wider") or grow.get("deeper")):
        return model, []
    try:
        net2net = importlib.import_module("trainhub.models.net2net")
    except ImportError:
        raise RuntimeError(
            "model.grow needs trainhub.models.net2net (Net2Net), which this installation "
            "lacks; upgrade trainhub or drop model.grow"
        ) from None
    done = []
    # a GrowthError (a ValueError) names the layer; the spec path says where the user wrote it
    for layer, factor in (grow.get("wider") or {}).items():
        try:
            model = net2net.wider(model, layer, float(factor))
        except ValueError as exc:
            raise ValueError(f"model.grow.wider.{layer}: {exc}") from None
        done.append(f"wider {layer} x{factor}")
    for i, layer in enumerate(grow.get("deeper") or ()):
        try:
            model = net2net.deeper(model, layer)
        except ValueError as exc:
            raise ValueError(f"model.grow.deeper.{i}: {exc}") from None
        done.append(f"deeper {layer}")
    return model, done


def initialize(
    model: nn.Module, plan: ModelPlan, *, weights: Mapping[str, torch.Tensor] | None
) -> tuple[nn.Module, InitReport]:
    """Apply ``plan`` to ``model`` given the loaded ``weights`` (None: nothing to load)."""
    if hasattr(model, "module") and isinstance(model.module, nn.Module):
        raise ValueError("call init_model before prepare_model (it takes the bare model)")
    names = [n for n, _ in model.named_parameters()]
    _check_patterns(plan.reset, list(model.state_dict()), "reset")
    matched: list[str] = []
    missing: list[str] = []
    unexpected: list[str] = []
    if weights is not None:
        matched, missing, unexpected = load_matching(model, weights, plan.reset)
    model, grown = _grow(model, plan.grow)
    names = [n for n, _ in model.named_parameters()]
    reset = _reset(model, plan.reset) if plan.reset else []
    _check_patterns(plan.freeze, names, "freeze")
    frozen = []
    for name, parameter in model.named_parameters():
        if _matches(name, plan.freeze):
            parameter.requires_grad_(False)
            frozen.append(name)
    source = plan.init_from if isinstance(plan.init_from, str | Path) else None
    if source is None and weights is not None:
        source = "a state dict"
    report = InitReport(
        str(source) if source is not None else None,
        tuple(matched),
        tuple(reset),
        tuple(frozen),
        tuple(missing),
        tuple(unexpected),
        tuple(grown),
    )
    return model, report


@contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def download_init_weights(
    api_url: str, token: str | None, trial_id: int, spool: Path, timeout_s: float = 600.0
) -> Path:
    """The trial's starting weights in ``spool`` (downloaded once per node)."""
    import httpx

    from trainhub.runtime import direct_storage

    path = spool / "init" / "weights.pt"
    with _node_lock(path.with_suffix(".lock")):
        if path.exists():
            return path
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        partial = path.with_suffix(".part")
        direct = protocol.init_weights_path(trial_id) + "/direct"
        if direct_storage.fetch_if_direct(api_url, token, direct, partial, timeout_s):
            partial.replace(path)  # straight from the bucket (--rank-storage direct)
            return path
        url = api_url + protocol.init_weights_path(trial_id)
        with httpx.stream("GET", url, headers=headers, timeout=timeout_s) as response:
            if response.status_code >= 400:
                body = response.read().decode(errors="replace")[:500]
                raise RuntimeError(
                    f"cannot load the model.init_from weights: the control plane answered "
                    f"{response.status_code}: {body}"
                )
            with partial.open("wb") as out:
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
        partial.replace(path)
    return path


def load_weights(
    source: str | Path | Mapping[str, torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor]:
    if isinstance(source, Mapping):
        return extract_state_dict(source)
    path = Path(source)
    if not path.is_file():
        raise ValueError(
            f"init_from {str(source)!r} is not a file here; standalone, pass the path of a "
            "checkpoint (trainhub models download NAME saves one)"
        )
    return extract_state_dict(torch.load(path, map_location=device, weights_only=True))


def init_model(
    model: nn.Module,
    plan: ModelPlan,
    *,
    device: torch.device,
    api_url: str | None,
    token: str | None,
    trial_id: int | None,
    spool: Path | None,
) -> tuple[nn.Module, InitReport]:
    """``ctx.init_model``: resolve the weights (managed: the control plane's), then
    :func:`initialize`; logs the report."""
    weights = None
    if plan.init_from is not None:
        if api_url is not None and trial_id is not None and isinstance(plan.init_from, str):
            where = spool or Path(tempfile.gettempdir()) / f"trainhub-trial-{trial_id}"
            path = download_init_weights(api_url, token, trial_id, where)
            weights = load_weights(path, device)
        else:
            weights = load_weights(plan.init_from, device)
    model, report = initialize(model, plan, weights=weights)
    logger.info("%s", report)
    return model, report
