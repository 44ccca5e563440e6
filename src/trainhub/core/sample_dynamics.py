"""Training dynamics of samples: what the runtime records per sample and epoch, checked and packed.

A record says, for one training sample in one epoch: its id (stable across trials: the index in
the dataset's source files), the label it was trained with, the model's argmax, the margin of
the given label (its logit minus the largest other logit, the "area under the margin" of
Pleiss et al. 2020 once averaged), the softmax probability of the given label, and the loss.

The runtime sends records in columns (:class:`~trainhub.runtime.protocol.SampleRecordsBatch`);
the control plane checks them (:func:`records_from_columns`) and stores each batch packed
(:func:`pack`: 22 bytes per record, floats as float16) in one row. Pure: no I/O.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhub.core import limits
from trainhub.core.errors import FieldError

# the columns of a batch on the wire and in storage, with their stored dtypes
INT_COLUMNS = ("ids", "epochs", "labels", "predictions")
FLOAT_COLUMNS = ("margins", "probs", "losses")
_DTYPES: dict[str, str] = {
    "ids": "<i8",
    "epochs": "<i4",
    "labels": "<i2",
    "predictions": "<i2",
    "margins": "<f2",
    "probs": "<f2",
    "losses": "<f2",
}
_MAGIC = b"THSR1"
_FLOAT16_MAX = 65504.0


@dataclass(frozen=True)
class SampleRecords:
    """Records of one or more batches as parallel numpy arrays (one entry per sample-epoch)."""

    ids: np.ndarray  # int64
    epochs: np.ndarray  # int32
    labels: np.ndarray  # int16: the label trained with
    predictions: np.ndarray  # int16: argmax of the logits
    margins: np.ndarray  # float32 (stored float16): given logit - largest other logit
    probs: np.ndarray  # float32 (stored float16): softmax probability of the given label
    losses: np.ndarray  # float32 (stored float16): cross-entropy of the given label

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def correct(self) -> np.ndarray:
        return np.asarray(self.predictions == self.labels)

    @staticmethod
    def empty() -> SampleRecords:
        return SampleRecords(*(np.zeros(0, dtype=_DTYPES[c]) for c in _ALL))


_ALL = INT_COLUMNS + FLOAT_COLUMNS


def records_from_columns(columns: Mapping[str, Sequence[Any]], max_classes: int) -> SampleRecords:
    """Records of a batch's columns (``ValueError`` if :func:`check_columns` finds errors:
    call it first to report them with their field paths)."""
    errors = check_columns(columns, max_classes)
    if errors:
        raise ValueError("; ".join(f"{e.path}: {e.message}" for e in errors))
    arrays = [np.asarray(columns[c], dtype=_DTYPES[c]) for c in _ALL]
    return SampleRecords(*arrays[:4], *(a.astype(np.float32) for a in arrays[4:]))


def check_columns(columns: Mapping[str, Sequence[Any]], max_classes: int) -> list[FieldError]:
    """What is wrong with a batch's columns: missing, of unequal length, too long, ids or
    epochs out of range, labels outside ``0 .. max_classes - 1``, floats not finite."""
    missing = [c for c in _ALL if c not in columns]
    if missing:
        return [FieldError(c, "missing column", f"send all of {', '.join(_ALL)}") for c in missing]
    lengths = {c: len(columns[c]) for c in _ALL}
    n = lengths["ids"]
    if n > limits.MAX_SAMPLE_RECORDS_PER_REQUEST:
        return [
            FieldError(
                "ids",
                f"{n} records in one request; the limit is {limits.MAX_SAMPLE_RECORDS_PER_REQUEST}",
                "split the batch",
            )
        ]
    errors = [
        FieldError(c, f"{length} values; 'ids' has {n}")
        for c, length in lengths.items()
        if length != n
    ]
    if errors or n == 0:
        return errors
    bounds = {
        "ids": (0, limits.INT64_MAX),
        "epochs": (0, limits.MAX_SAMPLE_EPOCH),
        "labels": (0, max_classes - 1),
        "predictions": (0, max_classes - 1),
    }
    for column, (low, high) in bounds.items():
        values = columns[column]
        if not all(type(v) is int for v in values):
            errors.append(FieldError(column, "must hold integers only"))
            continue
        if min(values) < low or max(values) > high:
            errors.append(FieldError(column, f"values must lie in {low} .. {high}"))
    for column in FLOAT_COLUMNS:
        values = columns[column]
        if not all(type(v) in (int, float) for v in values):
            errors.append(FieldError(column, "must hold numbers only"))
            continue
        try:
            total = math.fsum(abs(float(v)) for v in values)
        except OverflowError:
            total = math.inf
        if not math.isfinite(total) or max(abs(float(v)) for v in values) > _FLOAT16_MAX:
            errors.append(
                FieldError(column, f"values must be finite and at most {_FLOAT16_MAX:g} in size")
            )
    return errors


def pack(records: SampleRecords) -> bytes:
    """The records as compact bytes: a header, then each column in its stored dtype."""
    parts = [_MAGIC, struct.pack("<Q", len(records))]
    for column in _ALL:
        parts.append(
            np.ascontiguousarray(getattr(records, column), dtype=_DTYPES[column]).tobytes()
        )
    return b"".join(parts)


def unpack(data: bytes) -> SampleRecords:
    """The inverse of :func:`pack`."""
    if not data.startswith(_MAGIC):
        raise ValueError("not packed sample records")
    (n,) = struct.unpack_from("<Q", data, len(_MAGIC))
    offset = len(_MAGIC) + 8
    arrays = []
    for column in _ALL:
        dtype = np.dtype(_DTYPES[column])
        arrays.append(np.frombuffer(data, dtype=dtype, count=n, offset=offset))
        offset += n * dtype.itemsize
    ints = [
        a.astype(_DTYPES[c].replace("<", "=")) for a, c in zip(arrays[:4], INT_COLUMNS, strict=True)
    ]
    floats = [a.astype(np.float32) for a in arrays[4:]]
    return SampleRecords(*ints, *floats)


def concat(parts: Sequence[SampleRecords]) -> SampleRecords:
    if not parts:
        return SampleRecords.empty()
    return SampleRecords(*(np.concatenate([getattr(p, c) for p in parts]) for c in _ALL))


def latest_attempt_only(parts: Sequence[SampleRecords], attempts: Sequence[int]) -> SampleRecords:
    """The records of ``parts`` where, for each sample and epoch, only the highest attempt's
    record stays (a trial restarted from a checkpoint trains some epochs again)."""
    if len(set(attempts)) <= 1:
        return concat(parts)
    records = concat(parts)
    attempt = np.concatenate([np.full(len(p), a) for p, a in zip(parts, attempts, strict=True)])
    order = np.lexsort((attempt, records.epochs, records.ids))
    ids, epochs = records.ids[order], records.epochs[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (ids[1:] != ids[:-1]) | (epochs[1:] != epochs[:-1])
    keep = np.sort(order[last])
    return SampleRecords(*(getattr(records, c)[keep] for c in _ALL))
