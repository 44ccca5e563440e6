"""Label-noise scores on synthetic training dynamics where the flipped labels are known."""

from __future__ import annotations

import numpy as np
import pytest

from trainhub.core.label_noise import class_report, flagged_fraction_ids, score_samples
from trainhub.core.sample_dynamics import (
    SampleRecords,
    check_columns,
    concat,
    latest_attempt_only,
    pack,
    records_from_columns,
    unpack,
)

NUM, CLASSES, EPOCHS = 300, 10, 8


def synthetic(seed: int = 0) -> tuple[SampleRecords, np.ndarray, np.ndarray]:
    """Records of a model that learns clean samples fast and fits flipped ones late; the
    flipped positions and the true labels."""
    rng = np.random.default_rng(seed)
    true = rng.integers(0, CLASSES, NUM)
    flipped = np.zeros(NUM, dtype=bool)
    flipped[rng.choice(NUM, 30, replace=False)] = True
    given = np.where(flipped, (true + rng.integers(1, CLASSES, NUM)) % CLASSES, true)
    hard = ~flipped & (rng.random(NUM) < 0.1)  # clean but slow to learn
    columns: dict[str, list[float] | list[int]] = {c: [] for c in _COLUMNS}
    for epoch in range(EPOCHS):
        base = np.where(flipped, -2.0 + 0.35 * epoch, np.where(hard, -0.5 + 0.4 * epoch, 2.0))
        margin = base + rng.normal(0, 0.4, NUM)
        prob = 1 / (1 + np.exp(-margin))
        prediction = np.where(margin > 0, given, np.where(flipped, true, (given + 1) % CLASSES))
        for name, values in (
            ("ids", np.arange(NUM) * 7),  # ids need not be positions
            ("epochs", np.full(NUM, epoch)),
            ("labels", given),
            ("predictions", prediction),
            ("margins", margin),
            ("probs", prob),
            ("losses", -np.log(prob)),
        ):
            columns[name].extend(values.tolist())
    return records_from_columns(columns, CLASSES), flipped, true


_COLUMNS = ("ids", "epochs", "labels", "predictions", "margins", "probs", "losses")


def test_flipped_samples_rank_first_and_are_flagged() -> None:
    records, flipped, true = synthetic()
    scores = score_samples(records)
    assert list(scores.ids) == [7 * i for i in range(NUM)]
    top = scores.ranking()[: flipped.sum()]
    assert set(top) == set(np.flatnonzero(flipped))
    assert scores.flagged[flipped].all()
    # hard clean samples climb above 0 within the epochs: most are not flagged
    assert scores.flagged.sum() <= flipped.sum() + 5
    # the suggested label of a flipped sample is its true one
    assert (scores.suggested[flipped] == true[flipped]).all()


@pytest.mark.parametrize("method", ["confidence", "forgetting", "combined"])
def test_other_scores_flag_as_many_and_find_the_flips(method: str) -> None:
    records, flipped, _ = synthetic(1)
    aum = score_samples(records)
    other = score_samples(records, method=method)
    assert other.flagged.sum() == aum.flagged.sum()
    found = (other.flagged & flipped).sum() / flipped.sum()
    assert found >= 0.6  # weaker signals than AUM (the ADR measures them)


def test_forgetting_regions_and_class_report_of_a_known_history() -> None:
    # sample 0: right, wrong, right, wrong (2 forgetting events); 1: never right; 2: always
    rows = [
        (0, 0, 1, 1, 1.0, 0.9),
        (0, 1, 1, 2, -1.0, 0.1),
        (0, 2, 1, 1, 1.0, 0.9),
        (0, 3, 1, 2, -1.0, 0.1),
        (1, 0, 0, 2, -2.0, 0.05),
        (1, 1, 0, 2, -2.0, 0.05),
        (2, 0, 2, 2, 3.0, 0.99),
        (2, 1, 2, 2, 3.0, 0.97),
    ]
    cols = list(zip(*rows, strict=True))
    columns = {
        "ids": list(cols[0]),
        "epochs": list(cols[1]),
        "labels": list(cols[2]),
        "predictions": list(cols[3]),
        "margins": list(cols[4]),
        "probs": list(cols[5]),
        "losses": [0.1] * len(rows),
    }
    scores = score_samples(records_from_columns(columns, 3))
    assert scores.forgetting.tolist() == [2, 2, 0]  # never learned: once per epoch seen
    assert scores.region.tolist() == ["ambiguous", "hard", "easy"]
    assert scores.flagged.tolist() == [False, True, False]  # AUM 0 is not below 0
    assert scores.suggested.tolist() == [1, 2, 2]
    report = class_report(scores, 3)
    assert report.confusion == [[0, 0, 1], [0, 0, 1], [0, 0, 1]]
    assert report.accuracy == [0.0, 0.0, 1.0]
    assert report.confused_pairs == [(0, 2, 1), (1, 2, 1)]
    assert report.regions == {"easy": [0, 0, 1], "ambiguous": [0, 1, 0], "hard": [1, 0, 0]}
    assert flagged_fraction_ids(scores, 0.34) == [1]


def test_records_pack_compactly_and_keep_the_latest_attempt() -> None:
    records, _, _ = synthetic()
    packed = pack(records)
    assert len(packed) == 13 + 22 * len(records)  # 22 bytes a record
    back = unpack(packed)
    assert (back.ids == records.ids).all()
    assert (back.predictions == records.predictions).all()
    assert np.allclose(back.margins, records.margins, atol=1e-2, rtol=1e-3)
    # attempt 2 trained epochs 6-7 again: its records replace attempt 1's
    late = records.epochs >= 6
    again = SampleRecords(*(getattr(records, c)[late] for c in _COLUMNS))
    redone = SampleRecords(*again.__dict__.values())
    object.__setattr__(redone, "margins", redone.margins + 10)
    merged = latest_attempt_only([records, redone], [1, 2])
    assert len(merged) == len(records)
    assert (merged.margins[merged.epochs >= 6] > 5).all()
    assert len(concat([records, redone])) == len(records) + len(redone)


def test_bad_columns_are_named() -> None:
    good = {c: [0] for c in _COLUMNS}
    assert check_columns(good, 2) == []
    assert [e.path for e in check_columns({**good, "labels": [5]}, 2)] == ["labels"]
    assert [e.path for e in check_columns({**good, "margins": [float("nan")]}, 2)] == ["margins"]
    assert [e.path for e in check_columns({**good, "epochs": [0, 1]}, 2)] == ["epochs"]
    missing = dict(good)
    del missing["probs"]
    assert [e.path for e in check_columns(missing, 2)] == ["probs"]
