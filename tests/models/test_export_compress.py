"""Export round trips (onnxruntime and TorchScript against PyTorch) and the compress job."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from trainhub import models
from trainhub.jobs import compress as compress_job
from trainhub.models import compress
from trainhub.models.export import export_version

pytest.importorskip("onnxruntime")

ARCH = {"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]}


def _checkpoint(model: torch.nn.Module, **extra: object) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), **extra}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_round_trip_matches_pytorch(tmp_path: Path, fmt: str) -> None:
    torch.manual_seed(0)
    model = models.create("lenet5", num_classes=10).eval()
    path, diff = export_version(_checkpoint(model), ARCH, fmt, tmp_path / f"m.{fmt}")
    assert diff <= 1e-4
    x = torch.randn(7, 1, 28, 28)  # another batch size than the export's example
    with torch.no_grad():
        expected = model(x).numpy()
    if fmt == "onnx":
        got = compress.ort_predict(compress.ort_session(path), x.numpy())
    else:
        with torch.no_grad():
            got = compress.load_torchscript(path)(x).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_export_needs_a_recorded_architecture(tmp_path: Path) -> None:
    model = models.create("lenet5", num_classes=10)
    with pytest.raises(ValueError, match="register it again with --arch"):
        export_version(_checkpoint(model), {}, "onnx", tmp_path / "m.onnx")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is fastest on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_the_compress_job_prunes_quantizes_and_measures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script a compress trial runs, standalone: digits, a small trained MLP."""
    from trainhub import data

    monkeypatch.chdir(tmp_path)  # the standalone runtime writes its metrics file here

    splits = data.load("digits")
    x, y = compress.as_arrays(splits.train)
    torch.manual_seed(0)
    arch = {"zoo": "mlp", "args": {"in_features": 64, "hidden": [64], "num_classes": 10}}
    model = models.create("mlp", in_features=64, hidden=(64,), num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(4):
        for i in range(0, len(x), 64):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                model(torch.from_numpy(x[i : i + 64])), torch.from_numpy(y[i : i + 64])
            )
            loss.backward()
            optimizer.step()
    source = tmp_path / "trained.pt"
    source.write_bytes(_checkpoint(model))
    out = tmp_path / "out"
    metrics = compress_job.main(
        [
            "--arch", json.dumps({**arch, "input": [1, 8, 8]}),
            "--prune", "0.5", "--quantize", "int8", "--finetune-epochs", "1",
            "--init-from", str(source), "--out", str(out), "--latency-repeats", "20",
        ]
    )  # fmt: skip
    assert metrics["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert metrics["base_accuracy"] > 0.9
    assert metrics["accuracy_loss_points"] <= 3.0
    assert metrics["size_ratio"] > 3.0  # int8 and zeros against float32
    state = torch.load(out / "compressed.pt", weights_only=True)
    pruned = models.create("mlp", in_features=64, hidden=(64,), num_classes=10)
    pruned.load_state_dict(state["model"])
    assert compress.sparsity(pruned) == pytest.approx(0.5, abs=0.01)
    # the int8 ONNX it carries answers like the pruned float model on most inputs
    path, disagreement = export_version(
        (out / "compressed.pt").read_bytes(),
        {**arch, "input": [1, 8, 8]},
        "onnx",
        tmp_path / "q.onnx",
    )
    assert path.read_bytes() == (out / "model-int8.onnx").read_bytes()
    assert disagreement <= 0.25
