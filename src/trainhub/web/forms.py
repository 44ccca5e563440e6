"""A form's text fields read through the API's own input models, so a page accepts exactly
what the API accepts and refuses the rest with a message naming the field."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from trainhub.core.errors import InvalidRequest

_M = TypeVar("_M", bound=BaseModel)


def parse_form(model: type[_M], fields: dict[str, str], *, checkboxes: tuple[str, ...] = ()) -> _M:
    """``model`` from the form's non-empty fields (an empty field means "not given"); the
    named checkboxes are True when present, False when absent (browsers send nothing)."""
    data: dict[str, object] = {k: v.strip() for k, v in fields.items() if v.strip()}
    for name in checkboxes:
        data[name] = name in fields
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "form"
        raise InvalidRequest(
            f"{where}: {first['msg']}", "correct the field and send the form again"
        ) from None
