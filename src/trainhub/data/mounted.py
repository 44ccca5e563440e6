"""Loaders for a tenant dataset a trial mounts (the spec's ``data`` list, docs/data.md).

Three common layouts, detected from what the folder holds (or named with ``layout=``):

- ``image_folder``: one sub-folder per class of image files (``train/cat/001.png``); with
  ``train/`` and ``val/`` (or ``test/``) sub-folders these are the splits, else the images are
  split at random. Images are read with Pillow, converted to ``mode`` and resized to ``size``.
- ``tensors``: a NumPy (``.npz`` with ``x`` and ``y`` arrays, or ``x.npy`` and ``y.npy``) or
  PyTorch file (``.pt``: a dict with ``x`` and ``y`` tensors, or a ``(x, y)`` tuple).
- ``csv``: one CSV file with a header; the ``label`` column (``label_column=``) is the class
  (integers or names), every other column a float feature.

Example::

    from trainhub.data.mounted import load_mounted
    splits = load_mounted("/data/flowers", layout="image_folder", size=(32, 32))
    loader = data.make_loader(splits.train, batch_size=64, shuffle=True)

Inside a trial the mount path is where the spec put it; a rank that runs without a sandbox
(``--sandbox none``) reads the node's cached copy instead, which :func:`mounted_path` finds
(``TRAINHUB_DATA_MOUNTS``). Run standalone, the path is taken as it is.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from trainhub.data.splits import Splits, split_indices, to_tensor_dataset

MOUNTS_ENV = "TRAINHUB_DATA_MOUNTS"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LAYOUTS = ("image_folder", "tensors", "csv")


def mounted_path(mount: str | os.PathLike[str]) -> Path:
    """Where the dataset the spec mounts at ``mount`` can be read by this process."""
    text = str(mount)
    mapping: dict[str, str] = json.loads(os.environ.get(MOUNTS_ENV) or "{}")
    for target, source in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        if text == target or text.startswith(target.rstrip("/") + "/"):
            return Path(source + text[len(target) :])
    return Path(text)


def detect_layout(root: Path) -> str:
    """The layout of ``root`` (a folder or a file), one of :data:`LAYOUTS`."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    suffixes = {p.suffix.lower() for p in files}
    if suffixes & {".npz", ".npy", ".pt", ".pth"}:
        return "tensors"
    if ".csv" in suffixes:
        return "csv"
    if suffixes & set(IMAGE_SUFFIXES):
        return "image_folder"
    raise ValueError(
        f"{root} holds no images, .npz/.npy/.pt tensors or .csv file; see docs/data.md"
    )


def load_mounted(
    mount: str | os.PathLike[str],
    *,
    layout: str | None = None,
    val_fraction: float = 0.2,
    seed: int = 0,
    **options: Any,
) -> Splits:
    """The dataset at ``mount`` as train and validation :class:`Splits`, inputs standardised.

    Args:
        layout: one of :data:`LAYOUTS`; detected when None.
        val_fraction: the validation share where the data has no split of its own.
        seed: seed of that split.
        options: per layout: ``size``, ``mode`` (image_folder); ``label_column`` (csv).
    """
    root = mounted_path(mount)
    if not root.exists():
        raise FileNotFoundError(
            f"{mount} does not exist: is it in the spec's data list (mount: {mount})?"
        )
    layout = layout or detect_layout(root)
    if layout == "image_folder":
        parts = _image_splits(root, **options)
    elif layout == "tensors":
        parts = _tensor_arrays(root)
    elif layout == "csv":
        parts = _csv_arrays(root, **options)
    else:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    return _splits(parts, val_fraction, seed, f"{layout} at {mount}")


Arrays = tuple[np.ndarray, np.ndarray]


def _splits(
    parts: tuple[Arrays, Arrays | None, int], val_fraction: float, seed: int, what: str
) -> Splits:
    (x, y), given_val, num_classes = parts
    if given_val is None:
        val_size = max(1, round(len(x) * val_fraction)) if len(x) > 1 else 0
        train, val = split_indices(
            len(x), train_size=len(x) - val_size, val_size=val_size, seed=seed
        )
        (xt, yt), (xv, yv) = (x[train], y[train]), (x[val], y[val])
    else:
        (xt, yt), (xv, yv) = (x, y), given_val
    axes = tuple(i for i in range(xt.ndim) if i != 1) if xt.ndim > 2 else (0,)
    mean = xt.astype(np.float64).mean(axis=axes, keepdims=True)[0]
    std = xt.astype(np.float64).std(axis=axes, keepdims=True)[0] + 1e-8
    return Splits(
        to_tensor_dataset(xt, yt, mean, std),
        to_tensor_dataset(xv, yv, mean, std),
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in xt.shape[1:]),
        description=f"{what}: {len(xt)} train / {len(xv)} val",
    )


def _image_folder(
    root: Path, classes: list[str] | None, size: tuple[int, int], mode: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    from PIL import Image

    classes = classes or sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{root} has no class folders (one folder per class of images)")
    images, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                with Image.open(path) as image:
                    pixels = np.asarray(image.convert(mode).resize(size), dtype=np.float32)
                images.append(pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1))
                labels.append(label)
    if not images:
        raise ValueError(f"{root} holds no images in its class folders")
    return np.stack(images), np.asarray(labels), classes


def _image_splits(
    root: Path, size: tuple[int, int] = (32, 32), mode: str = "RGB"
) -> tuple[Arrays, Arrays | None, int]:
    val_dir = next((root / n for n in ("val", "validation", "test") if (root / n).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        x, y, classes = _image_folder(root / "train", None, tuple(size), mode)  # type: ignore[arg-type]
        xv, yv, _ = _image_folder(val_dir, classes, tuple(size), mode)  # type: ignore[arg-type]
        return (x, y), (xv, yv), len(classes)
    x, y, classes = _image_folder(root, None, tuple(size), mode)  # type: ignore[arg-type]
    return (x, y), None, len(classes)


def _labels(y: np.ndarray) -> tuple[np.ndarray, int]:
    if y.dtype.kind in "iu":
        return y.astype(np.int64), int(y.max()) + 1 if len(y) else 0
    names, index = np.unique(y.astype(str), return_inverse=True)
    return index.astype(np.int64), len(names)


def _tensor_arrays(root: Path) -> tuple[Arrays, Arrays | None, int]:
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*") if p.suffix in (".npz", ".npy", ".pt", ".pth"))
    by_name = {p.name: p for p in files}
    if "x.npy" in by_name and "y.npy" in by_name:
        x, y = np.load(by_name["x.npy"]), np.load(by_name["y.npy"])
    else:
        path = files[0]
        if path.suffix == ".npz":
            with np.load(path) as arrays:
                x, y = arrays["x"], arrays["y"]
        else:
            import torch

            loaded = torch.load(path, map_location="cpu", weights_only=True)
            x, y = (loaded["x"], loaded["y"]) if isinstance(loaded, dict) else loaded
            x, y = np.asarray(x), np.asarray(y)
    labels, num_classes = _labels(np.asarray(y))
    return (np.asarray(x, dtype=np.float32), labels), None, num_classes


def _csv_arrays(root: Path, label_column: str = "label") -> tuple[Arrays, Arrays | None, int]:
    path = root if root.is_file() else sorted(root.rglob("*.csv"))[0]
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path} has no rows")
    if label_column not in rows[0]:
        raise ValueError(
            f"{path} has no {label_column!r} column (columns: {', '.join(rows[0])}); "
            "pass label_column="
        )
    features = [c for c in rows[0] if c != label_column]
    x = np.asarray([[float(r[c]) for c in features] for r in rows], dtype=np.float32)
    raw = np.asarray([r[label_column] for r in rows])
    if all(v.lstrip("-").isdigit() for v in raw):
        raw = raw.astype(np.int64)
    labels, num_classes = _labels(raw)
    return (x, labels), None, num_classes
