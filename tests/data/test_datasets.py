"""Datasets: digits, MNIST (IDX), CIFAR-10 (binary format), synthetic."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from trainhub import data
from trainhub.data.cifar10 import load_cifar10, read_cifar10_binary, write_cifar10_binary
from trainhub.data.mnist import default_root, load_mnist, read_idx, write_idx
from trainhub.data.synthetic import SyntheticClassification


def test_digits_split() -> None:
    splits = data.load("digits")
    assert (len(splits.train), len(splits.val)) == (1438, 359)
    x, y = splits.train[0]
    assert x.shape == (1, 8, 8)
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert splits.input_shape == (1, 8, 8)
    assert splits.num_classes == 10


def test_idx_round_trip(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz"):
        write_idx(tmp_path / name, images)
        assert np.array_equal(read_idx(tmp_path / name), images)


def test_idx_rejects_damage(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\x01\x00\x08\x01\x00\x00\x00\x02ab")
    with pytest.raises(ValueError, match="bad magic"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")
    with pytest.raises(ValueError, match="promises 5"):
        read_idx(tmp_path / "short")


def test_mnist_from_generated_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (50, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, 50))
    splits = load_mnist(tmp_path, train_size=40, val_size=10)
    assert (len(splits.train), len(splits.val)) == (40, 10)
    assert splits.train[0][0].shape == (1, 28, 28)


@pytest.mark.skipif(default_root() is None, reason="the shared MNIST files are not on this machine")
def test_real_mnist_test_set_splits_8000_2000() -> None:
    splits = load_mnist()  # verifies SHA256SUMS too
    assert (len(splits.train), len(splits.val)) == (8000, 2000)
    train_x, train_y = splits.train.tensors  # type: ignore[attr-defined]
    assert train_x.shape == (8000, 1, 28, 28)
    assert abs(train_x.mean().item()) < 0.1
    assert abs(train_x.std().item() - 1) < 0.1
    assert set(train_y.tolist()) == set(range(10))
    root = default_root()
    assert root is not None
    with gzip.open(root / "t10k-labels-idx1-ubyte.gz") as f:
        assert f.read(4) == b"\x00\x00\x08\x01"


def _write_cifar_dir(root: Path, per_batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    everything = []
    for name in ["data_batch_1.bin", "data_batch_2.bin", "test_batch.bin"]:
        images = rng.integers(0, 256, (per_batch, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch)
        write_cifar10_binary(root / name, images, labels)
        everything.append((images, labels))
    return everything[0]


def test_cifar10_binary_format(tmp_path: Path) -> None:
    images, labels = _write_cifar_dir(tmp_path, per_batch=7)
    raw = (tmp_path / "data_batch_1.bin").read_bytes()
    assert len(raw) == 7 * 3073
    # the real layout: label byte, then the red plane of image 0 row by row
    assert raw[0] == labels[0]
    assert raw[1:1025] == images[0, 0].tobytes()
    assert raw[3073] == labels[1]
    got_images, got_labels = read_cifar10_binary(tmp_path / "data_batch_1.bin")
    assert np.array_equal(got_images, images)
    assert np.array_equal(got_labels, labels)
    splits = load_cifar10(tmp_path)
    assert (len(splits.train), len(splits.val)) == (14, 7)
    assert splits.train[0][0].shape == (3, 32, 32)


def test_cifar10_rejects_a_truncated_file(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(bytes(3000))
    with pytest.raises(ValueError, match="3073-byte records"):
        read_cifar10_binary(tmp_path / "x.bin")


def test_synthetic_is_deterministic_and_any_size() -> None:
    big = SyntheticClassification(10**9, input_shape=(3, 8, 8), num_classes=5, seed=3)
    assert len(big) == 10**9
    x1, y1 = big[123_456_789]
    x2, y2 = SyntheticClassification(10**9, (3, 8, 8), 5, seed=3)[123_456_789]
    assert torch.equal(x1, x2)
    assert int(y1) == int(y2) == 123_456_789 % 5
    assert not torch.equal(big[0][0], big[5][0])  # same class, different noise
    splits = data.load("synthetic", num_train=100, num_val=20)
    assert not torch.equal(splits.train[0][0], splits.val[0][0])


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="available: cifar10, digits, mnist, synthetic"):
        data.load("imagenet")


def test_mnist_missing_in_a_trial_says_what_a_trial_user_can_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainhub.data import mnist

    monkeypatch.setattr(mnist, "default_root", lambda: None)
    monkeypatch.setenv("TRAINHUB_TRIAL_ID", "34")
    monkeypatch.delenv("TRAINHUB_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError) as missing:
        data.load("mnist")
    text = str(missing.value)
    assert "this cluster has no datasets folder" in text
    assert "--data-dir" in text
    assert "admin" in text  # who can fix it
    assert 'load("digits")' in text
    assert "root=" in text  # what the user can do now
    assert "trainhub data push mnist" in text  # a dataset of their own tenant
    assert 'root="/data/mnist"' in text
    assert "set TRAINHUB_DATA_DIR" not in text
    monkeypatch.setenv("TRAINHUB_DATA_DIR", "/datasets")
    with pytest.raises(FileNotFoundError, match=r"datasets folder \(/datasets\) has no mnist/"):
        data.load("mnist")
    monkeypatch.delenv("TRAINHUB_TRIAL_ID")
    with pytest.raises(FileNotFoundError, match="/datasets/mnist does not exist"):
        data.load("mnist")


def test_mnist_from_a_mounted_dataset_is_read_where_the_rank_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pushed MNIST mounted at /data/mnist: an unsandboxed rank reads the node's copy."""
    import json

    copy = tmp_path / "cache" / "mnist"
    copy.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(copy / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (30, 28, 28)))
    write_idx(copy / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, 30))
    monkeypatch.setenv("TRAINHUB_DATA_MOUNTS", json.dumps({"/data/mnist": str(copy)}))
    splits = data.load("mnist", root="/data/mnist", train_size=20, val_size=10)
    assert (len(splits.train), len(splits.val)) == (20, 10)
    assert str(copy) in splits.description
