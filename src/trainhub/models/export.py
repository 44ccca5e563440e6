"""Export a registered model version to ONNX or TorchScript, checked against PyTorch."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainhub.models import compress, create
from trainhub.runtime.init_model import extract_state_dict

FORMATS = ("onnx", "torchscript")


def build(arch: Mapping[str, Any], weights: Mapping[str, Any]) -> torch.nn.Module:
    """The zoo model ``arch`` names, with ``weights`` (a checkpoint's dict) loaded strictly."""
    if not arch.get("zoo"):
        raise ValueError(
            "this version records no architecture (arch.zoo); register it again with --arch"
        )
    try:
        model = create(str(arch["zoo"]), **dict(arch.get("args") or {}))
    except TypeError as exc:  # arguments the zoo factory does not take
        raise ValueError(f"arch {dict(arch)} does not build: {exc}") from None
    try:
        model.load_state_dict(extract_state_dict(weights))
    except RuntimeError as exc:
        raise ValueError(f"the weights do not fit arch {dict(arch)}: {exc}") from None
    return model.eval()


def example_input(arch: Mapping[str, Any], batch: int = 4) -> torch.Tensor:
    shape = arch.get("input")
    if not shape:
        raise ValueError("this version records no input shape (arch.input); pass --input CxHxW")
    return torch.randn(batch, *[int(d) for d in shape], generator=torch.Generator().manual_seed(0))


def export_version(
    data: bytes, arch: Mapping[str, Any], fmt: str, out: Path, *, int8: bool = True
) -> tuple[Path, float]:
    """Write the version in ``fmt`` to ``out``; returns the path and the largest absolute
    difference from the PyTorch model's outputs (onnxruntime for ONNX; for an int8 ONNX of a
    compressed version, the share of inputs whose predicted class differs)."""
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    model = build(arch, state)
    example = example_input(arch)
    try:
        with torch.no_grad():
            model(example[:1])
    except RuntimeError as exc:
        shape = "x".join(str(d) for d in example.shape[1:])
        raise ValueError(
            f"the model does not take inputs of shape {shape} ({exc}); "
            "pass --input CxHxW with the shape it was trained on"
        ) from None
    if fmt == "torchscript":
        compress.export_torchscript(model, example[:1], out)
        loaded = compress.load_torchscript(out)
        with torch.no_grad():
            diff = float((loaded(example) - model(example)).abs().max())
        if diff > 1e-4:
            raise ValueError(f"TorchScript and PyTorch outputs differ by {diff:.2e}")
        return out, diff
    if fmt != "onnx":
        raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    packed = state.get("onnx_int8") if isinstance(state, Mapping) else None
    if int8 and isinstance(packed, torch.Tensor):
        onnx_bytes = packed.numpy().tobytes()
        out.write_bytes(onnx_bytes)
        session = compress.ort_session(onnx_bytes)
        got = compress.ort_predict(session, example.numpy()).argmax(axis=1)
        with torch.no_grad():
            want = model(example).argmax(dim=1).numpy()
        return out, float((got != want).mean())
    compress.export_onnx(model, example[:1], out)
    return out, compress.check_onnx(out, model, example)
