"""JSON request bodies validated straight from the request's bytes by a pydantic TypeAdapter.

FastAPI reads a declared body with ``json.loads`` and then validates the Python objects. For a
hot route (metrics: every runtime, up to 1,000 points a request) the route reads the bytes and
``adapter.validate_json`` parses and checks them in one pass in pydantic-core. A failure is the
same 422 as for a declared body (``RequestValidationError``, field paths under ``body``), and
:func:`json_body` documents the same request schema in the OpenAPI.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


def parse_json_body(adapter: TypeAdapter[T], body: bytes) -> T:
    """``body`` validated by ``adapter``; a RequestValidationError (422) naming the fields."""
    try:
        return adapter.validate_json(body)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=body) from None


def json_body(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its body with :func:`parse_json_body`: the
    request body's JSON schema, its definitions inlined."""
    schema = adapter.json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline(schema)}},
        }
    }
