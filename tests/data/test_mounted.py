"""The loaders of a mounted dataset: image folders, tensor files and CSV, and mount paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainhub.data.mounted import detect_layout, load_mounted, mounted_path


def test_an_image_folder_per_class_with_its_own_splits(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for colour in ("red", "blue", "green"):
            folder = tmp_path / split / colour
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    assert detect_layout(tmp_path) == "image_folder"
    splits = load_mounted(tmp_path, size=(8, 8))
    assert splits.num_classes == 3
    assert splits.input_shape == (3, 8, 8)
    assert len(splits.train) == 18
    assert len(splits.val) == 6
    x, y = splits.train.tensors[:2]  # type: ignore[attr-defined]
    assert sorted(set(y.tolist())) == [0, 1, 2]
    assert abs(float(x.mean())) < 0.1  # standardised per channel


def test_an_image_folder_without_splits_is_split_at_random(tmp_path: Path) -> None:
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(5):
            Image.new("L", (4, 4), color=i * 40).save(tmp_path / label / f"{i}.jpg")
    splits = load_mounted(tmp_path, mode="L", size=(4, 4), val_fraction=0.2)
    assert splits.input_shape == (1, 4, 4)
    assert (len(splits.train), len(splits.val)) == (8, 2)


def test_numpy_and_torch_tensor_files(tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32)
    y = np.arange(50) % 5
    np.savez(tmp_path / "set.npz", x=x, y=y)
    splits = load_mounted(tmp_path)
    assert (splits.num_classes, splits.input_shape) == (5, (4,))
    assert len(splits.train) + len(splits.val) == 50

    (tmp_path / "set.npz").unlink()
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, tmp_path / "set.pt")
    assert load_mounted(tmp_path / "set.pt").num_classes == 5


def test_csv_with_named_labels(tmp_path: Path) -> None:
    rows = ["f1,f2,kind"] + [f"{i},{i * 2},{'cat' if i % 2 else 'dog'}" for i in range(20)]
    (tmp_path / "table.csv").write_text("\n".join(rows) + "\n")
    splits = load_mounted(tmp_path, label_column="kind")
    assert (splits.num_classes, splits.input_shape) == (2, (2,))
    with pytest.raises(ValueError, match="no 'label' column"):
        load_mounted(tmp_path)


def test_a_mount_resolves_to_the_node_copy_without_a_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHUB_DATA_MOUNTS", json.dumps({"/data/x": str(tmp_path)}))
    assert mounted_path("/data/x/train") == Path(f"{tmp_path}/train")
    assert mounted_path("/data/xy") == Path("/data/xy")
    with pytest.raises(FileNotFoundError, match="data list"):
        load_mounted("/data/missing")
