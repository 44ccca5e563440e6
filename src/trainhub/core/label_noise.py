"""Which training samples are likely mislabeled, hard or easy, from one run's training dynamics.

Per sample, over the epochs it was seen (docs/adr/0013-label-noise-from-training-dynamics.md):

- **AUM**, area under the margin (Pleiss et al., NeurIPS 2020): the mean over epochs of the
  given label's logit minus the largest other logit. A mislabeled sample is pulled towards its
  true class by every similar clean sample, so its margin stays negative until the network
  memorises it; a clean sample's margin grows positive early.
- **Forgetting events** (Toneva et al., ICLR 2019): how often the sample went from classified
  correctly to incorrectly between consecutive epochs; a sample never learned counts as
  forgotten every epoch it was seen.
- **Cartography** (Swayamdipta et al., EMNLP 2020): confidence is the mean probability of the
  given label, variability its standard deviation over epochs; regions: *easy* (confident,
  stable), *ambiguous* (variable), *hard* (unconfident, stable: the usual place of mislabels).

The mislabel score is ``-AUM`` (margin units; above 0 means the model, averaged over training,
prefers another label) and a sample is flagged when its AUM is below ``threshold`` (0). The ADR
gives the measurement that chose AUM over confidence, forgetting and their rank average.

Pure: numpy arrays in, frozen results out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from trainhub.core.errors import FieldError
from trainhub.core.sample_dynamics import SampleRecords

# cartography regions: variability at or above this is "ambiguous"; below it the confidence
# decides between "easy" and "hard"
AMBIGUOUS_VARIABILITY = 0.2
EASY_CONFIDENCE = 0.5


class Region(StrEnum):
    EASY = "easy"
    AMBIGUOUS = "ambiguous"
    HARD = "hard"


SCORES = ("aum", "confidence", "forgetting", "combined")


@dataclass(frozen=True)
class SampleScores:
    """One entry per distinct sample id, sorted by id."""

    ids: np.ndarray  # int64
    labels: np.ndarray  # the given label (of the latest epoch)
    suggested: np.ndarray  # the label predicted most often over the epochs
    epochs_seen: np.ndarray
    aum: np.ndarray
    confidence: np.ndarray
    variability: np.ndarray
    correctness: np.ndarray  # share of epochs classified correctly
    forgetting: np.ndarray  # forgetting events (epochs seen if never learned)
    last_correct: np.ndarray  # bool: classified correctly in its latest epoch
    last_prediction: np.ndarray
    score: np.ndarray  # higher: more likely mislabeled
    flagged: np.ndarray  # bool
    region: np.ndarray  # Region values as str

    def __len__(self) -> int:
        return len(self.ids)

    def ranking(self) -> np.ndarray:
        """Positions sorted most suspicious first (ties by id)."""
        return np.lexsort((self.ids, -self.score))


def score_samples(
    records: SampleRecords, *, method: str = "aum", threshold: float = 0.0
) -> SampleScores:
    """Scores of every sample in ``records``.

    Args:
        records: sample-epoch records of one trial (any order; an id seen twice in one epoch,
            as a distributed sampler's padding does, counts twice).
        method: the mislabel score: ``aum`` (default, ``-AUM``), ``confidence``
            (``1 - confidence``), ``forgetting`` or ``combined`` (mean of the three ranks).
        threshold: flag samples whose AUM is below this (for ``aum``); the other methods flag
            as many samples as ``aum`` does, the top of their own ranking.
    """
    if method not in SCORES:
        raise ValueError(f"unknown score {method!r}; choose one of {', '.join(SCORES)}")
    if len(records) == 0:
        return _empty()
    order = np.lexsort((records.epochs, records.ids))
    ids = records.ids[order]
    unique, first, counts = np.unique(ids, return_index=True, return_counts=True)
    group = np.repeat(np.arange(len(unique)), counts)
    last = first + counts - 1
    n = counts.astype(np.float64)
    margins = records.margins[order].astype(np.float64)
    probs = records.probs[order].astype(np.float64)
    correct = records.correct[order]
    predictions = records.predictions[order].astype(np.int64)

    aum = np.bincount(group, margins) / n
    confidence = np.bincount(group, probs) / n
    second = np.bincount(group, probs * probs) / n
    variability = np.sqrt(np.maximum(second - confidence * confidence, 0.0))
    correctness = np.bincount(group, correct.astype(np.float64)) / n
    same = np.zeros(len(ids), dtype=bool)
    same[1:] = group[1:] == group[:-1]
    forgotten = same & ~correct & np.roll(correct, 1)
    forgetting = np.bincount(group, forgotten.astype(np.float64), minlength=len(unique))
    never = np.bincount(group, correct.astype(np.int64), minlength=len(unique)) == 0
    forgetting = np.where(never, n, forgetting)

    num_classes = int(max(predictions.max(), records.labels.max())) + 1
    votes = np.bincount(group * num_classes + predictions, minlength=len(unique) * num_classes)
    suggested = votes.reshape(len(unique), num_classes).argmax(axis=1)

    flagged = aum < threshold
    if method == "aum":
        score = -aum
    elif method == "confidence":
        score = 1.0 - confidence
    elif method == "forgetting":
        score = forgetting + 1e-3 * -aum  # many ties: the margin breaks them
    else:
        score = (_rank(-aum) + _rank(-confidence) + _rank(forgetting)) / 3.0
    if method != "aum":
        flagged = _top(score, int(flagged.sum()))

    region = np.where(
        variability >= AMBIGUOUS_VARIABILITY,
        Region.AMBIGUOUS.value,
        np.where(confidence >= EASY_CONFIDENCE, Region.EASY.value, Region.HARD.value),
    )
    return SampleScores(
        ids=unique,
        labels=records.labels[order][last].astype(np.int64),
        suggested=suggested,
        epochs_seen=counts,
        aum=aum,
        confidence=confidence,
        variability=variability,
        correctness=correctness,
        forgetting=forgetting,
        last_correct=correct[last],
        last_prediction=predictions[last],
        score=score,
        flagged=flagged,
        region=region,
    )


def _rank(values: np.ndarray) -> np.ndarray:
    """Ranks in [0, 1], 1 for the largest value."""
    if len(values) < 2:
        return np.ones(len(values))
    return np.argsort(np.argsort(values, kind="stable"), kind="stable") / (len(values) - 1)


def _top(score: np.ndarray, count: int) -> np.ndarray:
    flagged = np.zeros(len(score), dtype=bool)
    flagged[np.argsort(-score, kind="stable")[:count]] = True
    return flagged


def _empty() -> SampleScores:
    zero_i, zero_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    return SampleScores(
        zero_i, zero_i, zero_i, zero_i, zero_f, zero_f, zero_f, zero_f, zero_f,
        np.zeros(0, dtype=bool), zero_i, zero_f, np.zeros(0, dtype=bool), np.zeros(0, dtype=str),
    )  # fmt: skip


# ----------------------------------------------------------------------------- class summaries


@dataclass(frozen=True)
class ClassReport:
    """How the model does per class, in the latest epoch each sample was seen."""

    num_classes: int
    confusion: list[list[int]]  # [given label][predicted label]
    accuracy: list[float | None]  # per given label; None for a class without samples
    confused_pairs: list[tuple[int, int, int]]  # (given, predicted, count), most first
    regions: dict[str, list[int]]  # region -> count per given label
    flagged: list[int]  # flagged samples per given label


def class_report(
    scores: SampleScores, num_classes: int | None = None, top: int = 10
) -> ClassReport:
    if num_classes is None:
        seen = [int(scores.labels.max()), int(scores.last_prediction.max())] if len(scores) else []
        num_classes = max(seen, default=-1) + 1
    k = num_classes
    cells = np.bincount(scores.labels * k + scores.last_prediction, minlength=k * k)
    confusion = cells[: k * k].reshape(k, k)
    totals = confusion.sum(axis=1)
    accuracy = [float(confusion[c, c] / totals[c]) if totals[c] else None for c in range(k)]
    off = confusion.copy()
    np.fill_diagonal(off, 0)
    pairs = [
        (int(i // k), int(i % k), int(off.flat[i]))
        for i in np.argsort(-off, axis=None, kind="stable")[:top]
        if off.flat[i] > 0
    ]
    regions = {
        r.value: np.bincount(scores.labels[scores.region == r.value], minlength=k)[:k].tolist()
        for r in Region
    }
    flagged = np.bincount(scores.labels[scores.flagged], minlength=k)[:k].tolist()
    return ClassReport(k, confusion.tolist(), accuracy, pairs, regions, flagged)


def flagged_fraction_ids(scores: SampleScores, fraction: float) -> list[int]:
    """The ids of the top ``fraction`` of samples by score (at least one when any exist)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1]; got {fraction}")
    count = max(1, round(fraction * len(scores))) if len(scores) else 0
    return [int(scores.ids[i]) for i in scores.ranking()[:count]]


def relabel_errors(
    relabel: Mapping[int, int], tracked_ids: np.ndarray, num_classes: int
) -> list[FieldError]:
    """What is wrong with ``relabel`` (sample id -> new label) for a trial that tracked the
    samples ``tracked_ids`` with ``num_classes`` classes: ids it never tracked (a typo, or
    another dataset's ids) and labels that are no class of it; empty when it fits."""
    ids = np.fromiter(relabel, dtype=np.int64, count=len(relabel))
    known = np.isin(ids, tracked_ids)
    errors = []
    for sample_id, is_known in zip(ids.tolist(), known.tolist(), strict=True):
        label = relabel[sample_id]
        if not is_known:
            errors.append(
                FieldError(
                    f"relabel.{sample_id}",
                    "the trial tracked no sample with this id",
                    "take the ids from `trainhub debug TRIAL --csv FILE`",
                )
            )
        elif label >= num_classes:
            errors.append(
                FieldError(
                    f"relabel.{sample_id}",
                    f"label {label} is not a class of the trial (0 .. {num_classes - 1})",
                )
            )
    return errors
