"""Compression and export of a trained model: pruning, int8 quantization, ONNX and TorchScript.

What gives real wins on a CPU, and why (docs/adr/0015-model-registry.md):

* pruning with ``torch.nn.utils.prune`` (global L1 magnitude, or L2 whole output channels with
  ``structured=True``), fine-tuned with the masks in place, then made permanent. Zeros do not
  shrink a dense tensor; they make it compress (the registry stores and the size counts the
  gzip-compressed artifact, for the float baseline too);
* int8 through ONNX Runtime's static post-training quantization (``quantize_static``, QDQ,
  per-channel weights, calibrated on training samples). int8 weights are 4x smaller than
  float32, and ONNX Runtime's int8 kernels with its low per-call overhead are what makes batch-1
  inference fast on a CPU; ``torch.ao``'s eager int8 path needs a model rewritten with
  quant/dequant stubs, which the zoo's models are not;
* export: ``torch.onnx.export`` and ``torch.jit.trace``, each checked against the PyTorch
  outputs (ONNX by onnxruntime).
"""

from __future__ import annotations

import gzip
import io
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

_PRUNABLE = (nn.Linear, nn.Conv2d)


def prunable(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, _PRUNABLE)]


def apply_pruning(model: nn.Module, amount: float, *, structured: bool = False) -> nn.Module:
    """Mask ``amount`` of the weights (reparametrised: fine-tuning keeps them zero)."""
    from torch.nn.utils import prune

    if not 0.0 <= amount < 1.0:
        raise ValueError(f"--prune must be in [0, 1); got {amount}")
    if amount == 0:
        return model
    targets = prunable(model)
    if structured:
        # whole output channels (rows of a Linear) by L2 norm; the last layer keeps its classes
        for module, name in targets[:-1]:
            prune.ln_structured(module, name, amount=amount, n=2, dim=0)  # type: ignore[no-untyped-call]
    else:
        prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=amount)
    return model


def finish_pruning(model: nn.Module) -> nn.Module:
    """Make the masks permanent (plain ``weight`` tensors with zeros)."""
    from torch.nn.utils import prune

    for module, name in prunable(model):
        if prune.is_pruned(module) and hasattr(module, f"{name}_orig"):
            prune.remove(module, name)  # type: ignore[no-untyped-call]
    return model


def sparsity(model: nn.Module) -> float:
    weights: list[torch.Tensor] = [getattr(m, "weight") for m, _ in prunable(model)]  # noqa: B009
    total = sum(int(w.numel()) for w in weights)
    zeros = sum(int(torch.count_nonzero(w == 0)) for w in weights)
    return zeros / total if total else 0.0


def state_bytes(model: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def gz_size(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=9))


def export_onnx(
    model: nn.Module, example: torch.Tensor, path: Path, *, dynamo: bool = False
) -> Path:
    """ONNX (opset 17) with a dynamic batch dimension.

    The TorchScript-based exporter (``dynamo=False``) takes a fraction of a second for the
    zoo's models where the ``torch.export`` one takes over ten on a busy CPU; it is
    deprecated in torch 2.9+ (its warning is silenced here) and ``dynamo=True`` switches.
    """
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=dynamo,
        )
    return path


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """TorchScript by tracing (deprecated by PyTorch for torch.export, still what libtorch
    C++ loads; the deprecation warning is silenced here)."""
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, example)  # type: ignore[no-untyped-call]
        traced.save(str(path))
    return path


def load_torchscript(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))  # type: ignore[no-untyped-call]


def ort_session(model: bytes | Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def ort_predict(session: Any, inputs: np.ndarray, batch: int = 256) -> np.ndarray:
    name = session.get_inputs()[0].name
    outs = [
        session.run(None, {name: inputs[i : i + batch].astype(np.float32)})[0]
        for i in range(0, len(inputs), batch)
    ]
    return np.concatenate(outs)


def quantize_int8(
    float_onnx: Path, out: Path, calibration: np.ndarray, *, per_channel: bool = True
) -> Path:
    """Static int8 (QDQ, per-channel weights) calibrated on ``calibration`` inputs."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self, data: np.ndarray) -> None:
            self.items = iter(
                [{"input": data[i : i + 1].astype(np.float32)} for i in range(len(data))]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quantize_static(
        str(float_onnx),
        str(out),
        _Reader(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8,
    )
    return out


def check_onnx(
    onnx_model: bytes | Path, model: nn.Module, inputs: torch.Tensor, atol: float = 1e-4
) -> float:
    """Largest absolute difference of onnxruntime's and PyTorch's outputs on ``inputs``.

    Raises:
        ValueError: beyond ``atol``.
    """
    model.eval()
    with torch.no_grad():
        expected = model(inputs).numpy()
    got = ort_predict(ort_session(onnx_model), inputs.numpy())
    diff = float(np.max(np.abs(expected - got)))
    if diff > atol:
        raise ValueError(f"onnxruntime and PyTorch outputs differ by {diff:.2e} (> {atol:.0e})")
    return diff


def accuracy(predict: Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float((predict(x).argmax(axis=1) == y).mean())


def torch_predict(model: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    def predict(x: np.ndarray) -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return torch.cat(
                [model(torch.from_numpy(x[i : i + 512])) for i in range(0, len(x), 512)]
            ).numpy()

    return predict


def median_latency_s(run: Callable[[], object], repeats: int = 300, warmup: int = 30) -> float:
    """Median wall time of one call (batch 1 inference), after a warm-up."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_latency_s(model: nn.Module, example: torch.Tensor, repeats: int = 300) -> float:
    model.eval()

    def run() -> object:
        with torch.no_grad():
            return model(example)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same single thread onnxruntime gets
    try:
        return median_latency_s(run, repeats)
    finally:
        torch.set_num_threads(threads)


def ort_latency_s(session: Any, example: np.ndarray, repeats: int = 300) -> float:
    name = session.get_inputs()[0].name
    feed = {name: example.astype(np.float32)}
    return median_latency_s(lambda: session.run(None, feed), repeats)


def fine_tune(
    model: nn.Module,
    batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    epochs: int,
    lr: float = 1e-3,
) -> None:
    if epochs <= 0:
        return
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        for x, y in batches():
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    model.eval()


@dataclass(frozen=True)
class CompressionResult:
    """The compressed model and what it gained, measured in one process."""

    model: nn.Module  # pruned float weights (load into the same architecture)
    onnx_int8: bytes | None
    metrics: dict[str, float]


def compress(
    model: nn.Module,
    *,
    train: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    prune_amount: float,
    structured: bool = False,
    quantize: str | None = "int8",
    finetune_epochs: int = 1,
    batch_size: int = 64,
    workdir: Path,
    latency_repeats: int = 300,
    seed: int = 0,
) -> CompressionResult:
    """Prune (and fine-tune), quantize to int8 through ONNX Runtime, and measure size,
    accuracy and batch-1 latency against the float model."""
    torch.manual_seed(seed)
    x_val, y_val = val
    example = torch.from_numpy(x_val[:1])
    base_state = state_bytes(model)
    base_acc = accuracy(torch_predict(model), x_val, y_val)
    base_latency = torch_latency_s(model, example, latency_repeats)
    apply_pruning(model, prune_amount, structured=structured)
    x_train, y_train = train
    generator = torch.Generator().manual_seed(seed)

    def batches() -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(x_train), generator=generator)
        for i in range(0, len(order), batch_size):
            index = order[i : i + batch_size].numpy()
            yield torch.from_numpy(x_train[index]), torch.from_numpy(y_train[index])

    fine_tune(model, batches, finetune_epochs)
    finish_pruning(model)
    pruned_acc = accuracy(torch_predict(model), x_val, y_val)
    metrics = {
        "base_accuracy": base_acc,
        "pruned_accuracy": pruned_acc,
        "sparsity": sparsity(model),
        "base_size_bytes": float(len(base_state)),
        "base_size_gz_bytes": float(gz_size(base_state)),
        "base_latency_ms": base_latency * 1e3,
    }
    onnx_bytes = None
    final_acc = pruned_acc
    size = gz_size(state_bytes(model))
    latency = torch_latency_s(model, example, latency_repeats)
    if quantize == "int8":
        workdir.mkdir(parents=True, exist_ok=True)
        float_onnx = export_onnx(model, example, workdir / "float.onnx")
        check_onnx(float_onnx, model, torch.from_numpy(x_val[:64]))
        calibration = x_train[np.random.default_rng(seed).permutation(len(x_train))[:256]]
        int8_path = quantize_int8(float_onnx, workdir / "int8.onnx", calibration)
        onnx_bytes = int8_path.read_bytes()
        session = ort_session(onnx_bytes)
        final_acc = accuracy(lambda x: ort_predict(session, x), x_val, y_val)
        size = gz_size(onnx_bytes)
        latency = ort_latency_s(session, x_val[:1], latency_repeats)
        metrics["int8_onnx_bytes"] = float(len(onnx_bytes))
    elif quantize not in (None, "none"):
        raise ValueError(f"--quantize {quantize!r}: use int8 or none")
    metrics.update(
        {
            "accuracy": final_acc,
            "size_gz_bytes": float(size),
            "latency_ms": latency * 1e3,
            "size_ratio": metrics["base_size_gz_bytes"] / size,
            "accuracy_loss_points": (base_acc - final_acc) * 100.0,
            "latency_speedup": base_latency / latency,
        }
    )
    return CompressionResult(model, onnx_bytes, metrics)


def as_arrays(dataset: Any, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A ``TensorDataset`` of (input, label) as numpy arrays."""
    tensors: Sequence[torch.Tensor] = dataset.tensors
    x, y = tensors[0], tensors[1]
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return x.numpy().astype(np.float32), y.numpy()
