"""Bodies of the debugging routes: sample records in, debug reports out (docs/debugging.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from trainhub.core import limits
from trainhub.service.debugging import DebugReport

_N = limits.MAX_SAMPLE_RECORDS_PER_REQUEST
_Ints = Annotated[list[StrictInt], Field(max_length=_N)]
_Floats = Annotated[
    list[Annotated[StrictFloat | StrictInt, Field(allow_inf_nan=False)]], Field(max_length=_N)
]


class SampleRecordsIn(BaseModel):
    """Training dynamics of samples, one entry per sample and epoch, in columns of equal
    length (the runtime's ``ctx.track_samples`` sends them)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    attempt: Annotated[int, Field(ge=1, le=limits.INT64_MAX)] = 1
    uuid: str = Field(
        ..., pattern=r"^[A-Za-z0-9_-]{1,64}$", description="A retry stores nothing twice."
    )
    source: str | None = Field(None, max_length=limits.MAX_SAMPLE_SOURCE_CHARS)
    num_classes: Annotated[int, Field(ge=1, le=limits.MAX_SAMPLE_CLASSES)]
    ids: _Ints
    epochs: _Ints
    labels: _Ints
    predictions: _Ints
    margins: _Floats
    probs: _Floats
    losses: _Floats


class SuspiciousSample(BaseModel):
    id: int
    given: int = Field(description="The label trained with.")
    suggested: int = Field(description="The label the model predicted most often.")
    score: float = Field(description="Higher: more likely mislabeled.")
    flagged: bool
    aum: float = Field(description="Area under the margin: mean of given logit - largest other.")
    confidence: float = Field(description="Mean probability of the given label.")
    variability: float = Field(description="Its standard deviation over epochs.")
    forgetting: int = Field(description="Forgetting events (epochs seen if never learned).")
    region: str = Field(description="easy | ambiguous | hard (dataset cartography).")


class ConfusedPair(BaseModel):
    given: int
    predicted: int
    count: int


class ClassesPublic(BaseModel):
    confusion: list[list[int]] = Field(description="[given label][predicted label] counts.")
    accuracy: list[float | None]
    confused_pairs: list[ConfusedPair]
    regions: dict[str, list[int]] = Field(description="Region -> samples per given label.")
    flagged: list[int] = Field(description="Flagged samples per given label.")


class DebugPublic(BaseModel):
    trial_id: int
    source: str | None
    num_classes: int
    num_samples: int
    num_records: int
    epochs: int
    score: str
    num_flagged: int
    regions: dict[str, int]
    suspicious: list[SuspiciousSample]
    classes: ClassesPublic

    @classmethod
    def of(cls, report: DebugReport, top: int) -> DebugPublic:
        s, c = report.scores, report.classes
        return cls(
            trial_id=report.trial_id,
            source=report.source,
            num_classes=report.num_classes,
            num_samples=len(s),
            num_records=report.num_records,
            epochs=report.epochs,
            score=report.method,
            num_flagged=int(s.flagged.sum()),
            regions={r: int(sum(counts)) for r, counts in c.regions.items()},
            suspicious=[sample_of(report, int(i)) for i in s.ranking()[:top]],
            classes=ClassesPublic(
                confusion=c.confusion,
                accuracy=c.accuracy,
                confused_pairs=[
                    ConfusedPair(given=g, predicted=p, count=n) for g, p, n in c.confused_pairs
                ],
                regions=c.regions,
                flagged=c.flagged,
            ),
        )


def sample_of(report: DebugReport, i: int) -> SuspiciousSample:
    s = report.scores
    return SuspiciousSample(
        id=int(s.ids[i]),
        given=int(s.labels[i]),
        suggested=int(s.suggested[i]),
        score=round(float(s.score[i]), 4),
        flagged=bool(s.flagged[i]),
        aum=round(float(s.aum[i]), 4),
        confidence=round(float(s.confidence[i]), 4),
        variability=round(float(s.variability[i]), 4),
        forgetting=int(s.forgetting[i]),
        region=str(s.region[i]),
    )


CSV_COLUMNS = ("rank", *SuspiciousSample.model_fields)
