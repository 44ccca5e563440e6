"""ctx.track_samples keeps the right numbers; datasets carry sample ids; clones' filters apply."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import trainhub
from trainhub import data
from trainhub.runtime import protocol
from trainhub.runtime.data import make_data_loader
from trainhub.runtime.sample_filter import SampleFilter, apply_sample_filter
from trainhub.runtime.sample_tracking import LocalSampleSink, SampleTracker


def _expected(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, np.ndarray]:
    z, y = logits.double().numpy(), labels.numpy()
    rows = np.arange(len(y))
    given = z[rows, y]
    others = z.copy()
    others[rows, y] = -np.inf
    log_prob = given - np.log(np.exp(z).sum(1))
    return {
        "margins": given - others.max(1),
        "probs": np.exp(log_prob),
        "losses": -log_prob,
        "predictions": z.argmax(1),
    }


def _lines(path: Path) -> list[dict[str, list[float]]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tracking_keeps_the_right_numbers_and_counts_epochs(tmp_path: Path) -> None:
    sink = LocalSampleSink(tmp_path / "samples.jsonl")
    tracker = SampleTracker(torch.device("cpu"), sink, capacity=50)  # flushes mid-epoch too
    g = torch.Generator().manual_seed(0)
    sent: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for _epoch in range(3):
        order = torch.randperm(40, generator=g)
        for start in range(0, 40, 16):
            ids = order[start : start + 16] + 1000
            logits = torch.randn(len(ids), 5, generator=g) * 3
            labels = ids % 5
            tracker.track(ids, logits, labels, source="digits")
            sent.append((ids, logits, labels))
    assert tracker.close()
    lines = _lines(tmp_path / "samples.jsonl")
    assert all(b["source"] == "digits" and b["num_classes"] == 5 for b in lines)
    got = {c: np.concatenate([b[c] for b in lines]) for c in ("ids", "epochs", *_expected(
        sent[0][1], sent[0][2]))}  # fmt: skip
    ids = torch.cat([s[0] for s in sent]).numpy()
    want = {c: np.concatenate([_expected(s[1], s[2])[c] for s in sent]) for c in _expected(
        sent[0][1], sent[0][2])}  # fmt: skip
    assert (got["ids"] == ids).all()
    assert (got["predictions"] == want["predictions"]).all()
    for column in ("margins", "probs", "losses"):  # float16 precision
        assert np.allclose(got[column], want[column], rtol=2e-3, atol=2e-3), column
    # without epoch=, a sample's epoch is how often it was seen before
    assert sorted(np.bincount(got["epochs"]).tolist()) == [40, 40, 40]
    for sample in (1000, 1017, 1039):
        assert got["epochs"][got["ids"] == sample].tolist() == [0, 1, 2]


def test_an_epoch_is_shipped_when_the_next_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    tracker = SampleTracker(torch.device("cpu"), LocalSampleSink(path))
    ids, labels = torch.arange(8), torch.zeros(8, dtype=torch.int64)
    tracker.track(ids, torch.randn(8, 3), labels, epoch=4)
    assert not path.exists()  # nothing leaves the device within the epoch
    tracker.track(ids, torch.randn(8, 3), labels, epoch=5)
    assert [b["epochs"] for b in _lines(path)] == [[4] * 8]
    tracker.close()
    assert [b["epochs"][0] for b in _lines(path)] == [4, 5]
    with pytest.raises(ValueError, match="ids and labels must be"):
        tracker.track(ids[:3], torch.randn(8, 3), labels)


def test_ctx_track_samples_standalone_writes_a_local_file(clean_launch_env: Path) -> None:
    ctx = trainhub.init()
    splits = data.load("digits")
    loader = ctx.prepare_data_loader(splits.train.with_ids(), batch_size=256)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    for epoch in range(2):
        for x, y, ids in loader:
            ctx.track_samples(ids, model(x), y, epoch=epoch, source=splits.source)
    ctx.close()  # ships the last epoch's records
    lines = _lines(clean_launch_env / "trainhub-samples.jsonl")
    seen = np.concatenate([b["ids"] for b in lines])
    assert len(seen) == 2 * len(splits.train)
    assert set(seen.tolist()) == set(splits.train.sample_ids.tolist())


def test_digits_ids_name_the_same_image_whatever_the_split_seed() -> None:
    from sklearn.datasets import load_digits

    raw = load_digits().images
    for seed in (0, 1):
        splits = data.load("digits", seed=seed)
        x, _ = splits.train.tensors
        ids = splits.train.sample_ids
        assert not set(ids.tolist()) & set(splits.val.sample_ids.tolist())
        # standardised images: equal up to one affine map, the same for all samples
        a, b = raw[ids[0]].ravel(), x[0].numpy().ravel()
        scale = (b[1] - b[0]) / (a[1] - a[0]) if a[1] != a[0] else None
        if scale is not None:
            assert np.allclose(b, b[0] + (a - a[0]) * scale, atol=1e-4)
        assert splits.source == "digits"


def test_mnist_exposes_ids_into_the_t10k_files() -> None:
    from trainhub.data.mnist import default_root, mnist_images

    if default_root() is None:
        pytest.skip("the shared MNIST files are not on this machine")
    splits = data.load("mnist", train_size=100, val_size=10)
    assert splits.source == "mnist/t10k"
    ids = splits.train.sample_ids[:3].tolist()
    images = mnist_images(ids)
    x, _ = splits.train.tensors
    assert np.allclose((images.astype(np.float32) - 0.1307 * 255) / (0.3081 * 255), x[:3, 0])


def test_a_clones_filter_drops_and_relabels_training_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    splits = data.load("digits")
    ids = splits.train.sample_ids.tolist()
    drop, relabel = ids[:5], {ids[10]: 3, ids[11]: 4}
    monkeypatch.setenv(
        protocol.ENV_SAMPLE_FILTER,
        json.dumps({"drop": drop, "relabel": {str(k): v for k, v in relabel.items()}}),
    )
    loader = make_data_loader(splits.train.with_ids(), 2000, shuffle=True, rank=0, world_size=1)
    ((_x, y, got_ids),) = list(loader)
    assert len(got_ids) == len(ids) - 5
    assert not set(drop) & set(got_ids.tolist())
    labels = dict(zip(got_ids.tolist(), y.tolist(), strict=True))
    assert labels[ids[10]] == 3
    assert labels[ids[11]] == 4
    # trainhub.data's own loader too
    batches = list(data.make_loader(splits.train.with_ids(), 2000, rank=0, world_size=1))
    assert sum(len(b[0]) for b in batches) == len(ids) - 5
    # validation loaders (not shuffled) are left alone
    val = make_data_loader(splits.train, 2000, shuffle=False, rank=0, world_size=1)
    assert sum(len(b[0]) for b in val) == len(ids)
    # explicitly, and on a dataset without ids: unchanged, with a warning
    assert len(apply_sample_filter(splits.train)) == len(ids) - 5  # type: ignore[arg-type]
    plain = torch.utils.data.TensorDataset(torch.zeros(3))
    assert apply_sample_filter(plain) is plain
    with pytest.raises(ValueError, match=protocol.ENV_SAMPLE_FILTER):
        SampleFilter.from_env({protocol.ENV_SAMPLE_FILTER: "[1, 2"})


def test_the_wire_bounds_match_the_control_planes(tmp_path: Path) -> None:
    from trainhub.core import limits
    from trainhub.runtime.sample_tracking import SEND_RECORDS
    from trainhub.service.steering import SAMPLE_FILTER_ENV

    assert protocol.MAX_SAMPLE_RECORDS_PER_REQUEST == limits.MAX_SAMPLE_RECORDS_PER_REQUEST
    assert protocol.MAX_SAMPLE_CLASSES == limits.MAX_SAMPLE_CLASSES
    assert protocol.ENV_SAMPLE_FILTER == SAMPLE_FILTER_ENV
    assert SEND_RECORDS <= limits.MAX_SAMPLE_RECORDS_PER_REQUEST
    # the largest request the tracker sends (huge ids, long floats) fits the JSON body bound
    path = tmp_path / "big.jsonl"
    tracker = SampleTracker(torch.device("cpu"), LocalSampleSink(path))
    ids = torch.arange(2**62, 2**62 + SEND_RECORDS)
    logits = torch.randn(SEND_RECORDS, 10) * 1000 + 1 / 3
    tracker.track(ids, logits, torch.full((SEND_RECORDS,), 9), epoch=123456)
    tracker.close()
    (line,) = path.read_text().splitlines()
    assert len(line.encode()) < limits.MAX_JSON_BODY_BYTES


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_tracking_on_a_gpu_never_synchronises_with_the_host(tmp_path: Path) -> None:
    device = torch.device("cuda")
    tracker = SampleTracker(device, LocalSampleSink(tmp_path / "s.jsonl"), capacity=4096)
    ids = torch.arange(256, device=device)
    labels = ids % 10
    tracker.track(ids, torch.randn(256, 10, device=device), labels, epoch=0)  # allocates
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        for _ in range(8):
            tracker.track(ids, torch.randn(256, 10, device=device), labels, epoch=0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tracker.close()
    lines = _lines(tmp_path / "s.jsonl")
    assert sum(len(b["ids"]) for b in lines) == 9 * 256


def test_track_refuses_what_it_cannot_score_at_the_call(tmp_path: Path) -> None:
    tracker = SampleTracker(torch.device("cpu"), LocalSampleSink(tmp_path / "s.jsonl"))
    ids, logits = torch.arange(3), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"labels must lie in 0 \.\. 3 .*got 7"):
        tracker.track(ids, logits, torch.tensor([0, 1, 7]))
    with pytest.raises(ValueError, match="sample ids must be >= 0"):
        tracker.track(torch.tensor([-1, 0, 1]), logits, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="ids must be integers"):
        tracker.track(ids.float(), logits, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="logits must be a tensor"):
        tracker.track(ids, logits.tolist(), torch.tensor([0, 1, 2]))  # type: ignore[arg-type]
    tracker.track([5, 6, 7], logits, [0, 1, 2], epoch=0)  # type: ignore[arg-type]
    assert tracker.close()
    assert _lines(tmp_path / "s.jsonl")[0]["ids"] == [5, 6, 7]


def test_a_flush_leaves_out_labels_that_are_no_class(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a GPU the labels are checked only when flushed (a check per step would synchronise);
    stood in for here by a label changed in the tracker's buffer."""
    tracker = SampleTracker(torch.device("cpu"), LocalSampleSink(tmp_path / "s.jsonl"))
    tracker.track(torch.arange(4), torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), epoch=0)
    tracker._labels[1] = 9
    with caplog.at_level("WARNING", logger="trainhub.runtime"):
        assert tracker.close()
    (batch,) = _lines(tmp_path / "s.jsonl")
    assert batch["ids"] == [0, 2, 3]
    assert batch["epochs"] == [0, 0, 0]
    assert "1 labels outside 0 .. 2 (e.g. 9)" in caplog.text
