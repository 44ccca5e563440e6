"""Bounded path and query parameters, and the error responses each route documents.

Ids, steps, attempts and offsets are 64-bit (what the database holds): a larger number is a
422 naming the parameter, never an OverflowError deep in a driver.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query
from pydantic import BaseModel, Field

from trainhub.core.limits import INT64_MAX, MAX_LIST_FILTER_CHARS

ExperimentId = Annotated[int, Path(ge=1, le=INT64_MAX, description="An experiment id.")]
TrialId = Annotated[int, Path(ge=1, le=INT64_MAX, description="A trial id.")]
CheckpointId = Annotated[int, Path(ge=1, le=INT64_MAX, description="A checkpoint id.")]
TokenId = Annotated[int, Path(ge=1, le=INT64_MAX, description="A token id.")]
Name = Annotated[str, Path(min_length=1, max_length=64)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX, description="Items or bytes to skip.")]
Step = Annotated[int, Query(ge=0, le=INT64_MAX)]
Attempt = Annotated[int, Query(ge=1, le=INT64_MAX)]
ListFilter = Annotated[str, Query(max_length=MAX_LIST_FILTER_CHARS)]
# limits.EXPERIMENT_SORTS and limits.SORT_ORDERS (a Literal needs them spelled out)
ExperimentSort = Literal["created", "name", "best"]
SortOrder = Literal["asc", "desc"]


class ErrorDetail(BaseModel):
    path: str = Field(description="Dotted field path ('' for the whole input).")
    message: str
    hint: str = ""


class ErrorPublic(BaseModel):
    """Every error answer: what was wrong and how to fix it."""

    code: str = Field(description="Machine-readable: invalid_spec, not_found, too_large, ...")
    message: str
    hint: str | None = None
    errors: list[ErrorDetail] | None = Field(None, description="Per-field problems.")


_MEANING = {
    400: "The request is malformed or names something that does not fit.",
    401: "No valid API token.",
    403: "The token may not do this (role, or a trial's token outside its trial).",
    404: "No such object, or it belongs to a tenant the caller is not in.",
    409: "The object's state does not allow this (e.g. the trial already ended).",
    411: "A body was sent without Content-Length.",
    413: "A body, upload or storage quota bound was passed; the message names it.",
    422: "A field is invalid or beyond its bound; 'errors' lists each with its path.",
    429: "Too many failed authentications (a valid token always passes), or a trial's metric "
    "points over its per-minute cap; see Retry-After.",
}
# every route may answer these: the request guard and the body/parameter validation
_COMMON = (400, 401, 403, 413, 422, 429)


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the common errors plus ``codes``."""
    return {
        code: {"model": ErrorPublic, "description": _MEANING[code]}
        for code in sorted({*_COMMON, *codes})
    }
