"""Use cases of debugging a model's data: store the training dynamics a trial's runtime sends
(``ctx.track_samples``), and report its likely mislabeled, hard and easy samples, its confusion
matrix, and an image grid of the most suspicious samples (docs/debugging.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainhub.core import limits
from trainhub.core.errors import Conflict, FieldError, InvalidRequest, InvalidSpec, TooLarge
from trainhub.core.label_noise import (
    SCORES,
    ClassReport,
    SampleScores,
    class_report,
    flagged_fraction_ids,
    relabel_errors,
    score_samples,
)
from trainhub.core.sample_dynamics import (
    check_columns,
    latest_attempt_only,
    pack,
    records_from_columns,
    unpack,
)
from trainhub.service.clock import Clock
from trainhub.service.ports import Principal
from trainhub.service.repository import UnitOfWork
from trainhub.service.tracking import _trial_for, _writable_trial

_UUID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class StoredBatch:
    attempt: int
    source: str | None
    num_classes: int
    num_records: int
    data: bytes  # core.sample_dynamics.pack


class SampleStore(Protocol):
    """Where batches of sample records live (one row each)."""

    def add_batch(self, trial_id: int, batch: StoredBatch, uuid: str, now: float) -> bool:
        """Store ``batch`` unless one with ``uuid`` exists; True when stored."""
        ...

    def count_records(self, trial_id: int) -> int: ...

    def batches(self, trial_id: int) -> list[StoredBatch]: ...


@dataclass(frozen=True)
class Tile:
    sample_id: int
    given: int
    suggested: int
    score: float


class SampleGallery(Protocol):
    """Images of a dataset's samples, drawn as a grid."""

    def grid_png(self, source: str, tiles: Sequence[Tile]) -> bytes:
        """A PNG of the tiles' images with their labels; ``LookupError`` if the source's
        images are not available here."""
        ...


@dataclass(frozen=True)
class DebugReport:
    trial_id: int
    source: str | None
    num_classes: int
    num_records: int
    epochs: int
    method: str
    scores: SampleScores
    classes: ClassReport


class DebugService:
    def __init__(
        self,
        uow: UnitOfWork,
        store: SampleStore,
        clock: Clock,
        gallery: SampleGallery | None = None,
    ) -> None:
        self.uow = uow
        self.store = store
        self.clock = clock
        self.gallery = gallery

    def record_samples(self, principal: Principal, trial_id: int, batch: Mapping[str, Any]) -> bool:
        """Store a batch of sample records (the trial's own token only); False for a retry."""
        uuid = str(batch.get("uuid", ""))
        if not _UUID.match(uuid):
            raise InvalidSpec([FieldError("uuid", "1-64 letters, digits, '-' or '_'")])
        num_classes = batch.get("num_classes")
        if (
            isinstance(num_classes, bool)
            or not isinstance(num_classes, int)
            or not 1 <= num_classes <= limits.MAX_SAMPLE_CLASSES
        ):
            raise InvalidSpec(
                [FieldError("num_classes", f"an integer in 1 .. {limits.MAX_SAMPLE_CLASSES}")]
            )
        errors = check_columns(batch, num_classes)
        if errors:
            raise InvalidSpec(errors[:20])
        records = records_from_columns(batch, num_classes)
        source = batch.get("source")
        if source is not None and (
            not isinstance(source, str) or len(source) > limits.MAX_SAMPLE_SOURCE_CHARS
        ):
            raise InvalidSpec(
                [FieldError("source", f"at most {limits.MAX_SAMPLE_SOURCE_CHARS} characters")]
            )
        attempt = int(batch.get("attempt", 1))
        now = self.clock()
        with self.uow() as repo:
            _writable_trial(repo, principal, trial_id, attempt, "sample records", now)
        held = self.store.count_records(trial_id)
        if held + len(records) > limits.MAX_SAMPLE_RECORDS_PER_TRIAL:
            raise TooLarge(
                f"trial {trial_id} holds {held} sample records; {len(records)} more exceed the "
                f"limit of {limits.MAX_SAMPLE_RECORDS_PER_TRIAL}",
                "track a subset of the samples or fewer epochs",
            )
        stored = StoredBatch(attempt, source, num_classes, len(records), pack(records))
        return self.store.add_batch(trial_id, stored, uuid, now)

    def report(
        self, principal: Principal, trial_id: int, *, method: str = "aum", threshold: float = 0.0
    ) -> DebugReport:
        """Every tracked sample's scores and region, and the per-class summary."""
        if method not in SCORES:
            raise InvalidRequest(f"unknown score {method!r}", f"choose one of {', '.join(SCORES)}")
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
        batches = self.store.batches(trial_id)
        if not batches:
            raise Conflict(
                f"trial {trial_id} has no sample records",
                "call ctx.track_samples(ids, logits, labels) in its training loop "
                "(docs/debugging.md); records arrive at each epoch's end",
            )
        records = latest_attempt_only(
            [unpack(b.data) for b in batches], [b.attempt for b in batches]
        )
        num_classes = max(b.num_classes for b in batches)
        scores = score_samples(records, method=method, threshold=threshold)
        return DebugReport(
            trial_id=trial_id,
            source=next((b.source for b in reversed(batches) if b.source), None),
            num_classes=num_classes,
            num_records=len(records),
            epochs=int(np.unique(records.epochs).size),
            method=method,
            scores=scores,
            classes=class_report(scores, num_classes),
        )

    def check_relabel(
        self, principal: Principal, trial_id: int, relabel: Mapping[int, int]
    ) -> None:
        """Refuse relabels of samples the trial never tracked or to labels that are no class
        of it; a trial without sample records has nothing to check against."""
        with self.uow() as repo:
            _trial_for(repo, principal, trial_id, write=False)
        batches = self.store.batches(trial_id) if relabel else []
        if not batches:
            return
        records = latest_attempt_only(
            [unpack(b.data) for b in batches], [b.attempt for b in batches]
        )
        num_classes = max(b.num_classes for b in batches)
        errors = relabel_errors(relabel, np.unique(records.ids), num_classes)
        if errors:
            raise InvalidSpec(errors[:20])

    def flagged_ids(self, principal: Principal, trial_id: int, fraction: float) -> list[int]:
        """The ids of the most suspicious ``fraction`` of a trial's samples."""
        if not 0 < fraction <= 1:
            raise InvalidRequest(f"fraction {fraction} is not in (0, 1]", "e.g. 0.05 for 5%")
        return flagged_fraction_ids(self.report(principal, trial_id).scores, fraction)

    def grid_png(self, principal: Principal, trial_id: int, top: int) -> bytes:
        """A PNG of the ``top`` most suspicious samples with their given and suggested labels."""
        if not 1 <= top <= limits.MAX_DEBUG_PNG_SAMPLES:
            raise InvalidRequest(f"top must lie in 1 .. {limits.MAX_DEBUG_PNG_SAMPLES}")
        report = self.report(principal, trial_id)
        if report.source is None or self.gallery is None:
            raise Conflict(
                f"trial {trial_id}'s samples have no images here",
                "pass source=splits.source to ctx.track_samples (trainhub.data's datasets)",
            )
        s = report.scores
        tiles = [
            Tile(int(s.ids[i]), int(s.labels[i]), int(s.suggested[i]), float(s.score[i]))
            for i in s.ranking()[:top]
        ]
        try:
            return self.gallery.grid_png(report.source, tiles)
        except LookupError as exc:
            raise Conflict(
                f"the images of {report.source!r} are not available to the control plane: {exc}",
                "set the server's data directory (TRAINHUB_DATA_DIR) to hold the dataset",
            ) from None
