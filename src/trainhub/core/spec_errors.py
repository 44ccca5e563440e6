"""Turn pydantic's validation errors into field paths with hints a user can act on."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from trainhub.core.errors import FieldError


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (to list its known fields)."""
    current: type[BaseModel] = model
    for part in loc:
        if not isinstance(part, str):
            continue
        info = current.model_fields.get(part)
        if info is None:
            return current
        annotation = info.annotation
        # an optional section (``X | None``) holds the fields of X
        models = [
            a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if len(models) == 1:
            annotation = models[0]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
        else:
            return current
    return current


def field_errors_from_pydantic(exc: ValidationError, model: type[BaseModel]) -> list[FieldError]:
    errors: list[FieldError] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            known = sorted(owner.model_fields) if owner else []
            name = str(loc[-1])
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            hint += "known fields here: " + ", ".join(known)
            errors.append(FieldError(path, f"unknown field {name!r}", hint))
        else:
            errors.append(FieldError(path, *explain(err)))
    return errors


def explain(err: Mapping[str, Any], where: str = "the spec") -> tuple[str, str]:
    """The message and hint of one pydantic error (``ValidationError.errors()``, also the
    API's request validation errors, ``where="the request"``) in words a user acts on."""
    kind = str(err["type"])
    message = str(err["msg"])
    hint = ""
    if kind == "missing":
        message = "this field is required"
        hint = f"add it to {where}"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif kind in {"enum", "literal_error"}:
        got = err.get("input")
        message = f"{got!r} is not allowed; " + message.replace("Input should be", "use")
    elif kind.startswith(("greater", "less")):
        hint = "change the value to lie in the allowed range"
    elif kind == "string_pattern_mismatch":
        hint = "use letters, digits, '-', '_' and '.', starting with a letter or digit"
    elif kind.endswith("_type") or kind.endswith("_parsing"):
        got = type(err.get("input")).__name__
        hint = f"got a value of type {got}"
    return message, hint
