"""MNIST from its original IDX files (LeCun et al.), gzipped or not.

The IDX format: a big-endian header of two zero bytes, a type code (0x08 = unsigned byte), the
number of dimensions, then one 4-byte size per dimension, then the data in C order.

Only the 10,000-image test set ships with trainhub's shared data; :func:`load_mnist` splits it
into 8,000 training and 2,000 validation images by default. Where the 60,000-image training
files are present too, pass ``files="train"``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
from pathlib import Path

import numpy as np

from trainhub.data.mounted import mounted_path
from trainhub.data.splits import Splits, split_indices, to_tensor_dataset

ENV_DATA_DIR = "TRAINHUB_DATA_DIR"  # holds mnist/, cifar10/, ...
MEAN, STD = 0.1307 * 255, 0.3081 * 255  # the usual MNIST normalisation, in pixel units
_IDX_TYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in an IDX file (``.gz`` is decompressed)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX element type 0x{code:02x}")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_TYPES[code])
    expected = int(np.prod(shape)) * dtype.itemsize
    data = raw[4 + 4 * ndim :]
    if len(data) != expected:
        raise ValueError(f"{path}: {len(data)} data bytes; the header promises {expected}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a ``uint8`` array as an IDX file (gzipped when ``path`` ends in ``.gz``)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    path = Path(path)
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


def default_root() -> Path | None:
    """``$TRAINHUB_DATA_DIR/mnist``, else the project's shared data, if either exists."""
    candidates = []
    if os.environ.get(ENV_DATA_DIR):
        candidates.append(Path(os.environ[ENV_DATA_DIR]) / "mnist")
    candidates.append(Path(__file__).resolve().parents[4] / "shared" / "data" / "mnist")
    return next((c for c in candidates if c.is_dir()), None)


def missing_message() -> str:
    """Why MNIST was not found, and what the person who runs the script can do about it.

    In a trial the datasets folder is the cluster's (``trainhub server --data-dir``), which only
    an admin sets: the message says so, and names what the trial's user can do instead (push
    the files as a dataset of the tenant and mount it, or use a bundled dataset)."""
    instead = (
        'use trainhub.data.load("digits") (bundled: 8x8 digits, no download), or ship the '
        "IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in your code "
        'context and pass trainhub.data.load("mnist", root="mnist")'
    )
    shared = os.environ.get(ENV_DATA_DIR)
    if os.environ.get("TRAINHUB_TRIAL_ID"):
        where = (
            f"the cluster's datasets folder ({shared}) has no mnist/ folder"
            if shared
            else "this cluster has no datasets folder"
        )
        return (
            f"MNIST is not on this cluster: {where}. Push the IDX files as a dataset of your "
            "tenant (`trainhub data push mnist FOLDER`), mount it in the spec (data: [{name: "
            'mnist, mount: /data/mnist}]) and pass trainhub.data.load("mnist", '
            'root="/data/mnist") (docs/data.md); or ask an admin to put them in DIR/mnist and '
            f"start the server with `trainhub server --data-dir DIR`; or {instead}"
        )
    where = f"{shared}/mnist does not exist" if shared else f"{ENV_DATA_DIR} is not set"
    return (
        f"no MNIST files here ({where}): set {ENV_DATA_DIR} to a folder holding mnist/ with "
        f"the IDX files, pass root=FOLDER, or {instead}"
    )


def _find(root: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (root / name).exists():
            return root / name
    raise FileNotFoundError(f"{root}: no {stem}[.gz]")


def verify_checksums(root: Path) -> None:
    """Check files listed in ``root/SHA256SUMS`` (if that file exists)."""
    sums = root / "SHA256SUMS"
    if not sums.exists():
        return
    for line in sums.read_text().splitlines():
        if not line.strip():
            continue
        digest, name = line.split()
        name = name.lstrip("*")
        if (root / name).exists():
            actual = hashlib.sha256((root / name).read_bytes()).hexdigest()
            if actual != digest:
                raise ValueError(f"{root / name}: SHA-256 {actual} != {digest} in SHA256SUMS")


def load_mnist(
    root: str | Path | None = None,
    *,
    files: str = "t10k",
    train_size: int = 8000,
    val_size: int = 2000,
    seed: int = 0,
) -> Splits:
    """MNIST images ``(1, 28, 28)``, standardised, split at random into train and val.

    Args:
        root: directory with ``{files}-images-idx3-ubyte[.gz]`` and ``...-labels-idx1-ubyte``
            (a dataset the spec mounts is found where the trial's process reads it);
            default :func:`default_root`.
        files: ``t10k`` (the test set: 10,000 images) or ``train`` (60,000).
        train_size, val_size: sizes of the disjoint parts.
        seed: seed of the split.

    Raises:
        FileNotFoundError: no MNIST files where looked.
    """
    where = mounted_path(root) if root is not None else default_root()
    if where is None:
        raise FileNotFoundError(missing_message())
    verify_checksums(where)
    images = read_idx(_find(where, f"{files}-images-idx3-ubyte"))
    labels = read_idx(_find(where, f"{files}-labels-idx1-ubyte"))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{where}: {images.shape[0]} images but {labels.shape[0]} labels")
    images = images.reshape(-1, 1, 28, 28)
    train, val = split_indices(len(images), train_size=train_size, val_size=val_size, seed=seed)
    return Splits(
        to_tensor_dataset(images[train], labels[train], MEAN, STD, sample_ids=train),
        to_tensor_dataset(images[val], labels[val], MEAN, STD, sample_ids=val),
        num_classes=10,
        input_shape=(1, 28, 28),
        description=f"MNIST {files} files at {where}, {train_size} train / {val_size} val, "
        f"seed {seed}",
        source=f"mnist/{files}",
    )


def mnist_images(ids: list[int], root: str | Path | None = None, files: str = "t10k") -> np.ndarray:
    """The ``uint8`` 28x28 images of the given sample ids (their indices in the files)."""
    where = mounted_path(root) if root is not None else default_root()
    if where is None:
        raise FileNotFoundError(missing_message())
    images = read_idx(_find(where, f"{files}-images-idx3-ubyte"))
    return np.asarray(images[np.asarray(ids, dtype=np.int64)])
