"""Loading a spec's YAML within bounds: size, nesting depth, alias expansion, integer length.

PyYAML builds the whole document, aliases expanded, before anyone can look at it: a 448-byte
document whose aliases nest nine per level expands to gigabytes, and a deeply nested one
overflows the recursion of its composer. So the text is first read as a stream of events (the
parser is iterative), computing for every anchor the size and depth it expands to; a document
beyond a bound is refused there, before anything is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.limits import (
    MAX_INT_DIGITS,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_EXPANDED_UNITS,
)

# libyaml's parser where PyYAML was built with it (10x faster than the pure-Python one)
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# YAML 1.1 integers as PyYAML resolves them (decimal, 0x, 0o, 0b, sexagesimal, underscores)
_INT = re.compile(
    r"^[-+]?(?:0b[0-1_]+|0[0-7_]+|(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|[1-9][0-9_]*(?::[0-5]?[0-9])+)$"
)


@dataclass
class _Open:
    """A mapping or sequence whose end has not been read yet."""

    anchor: str | None
    units: int = 1
    depth: int = 0  # deepest nesting below it


def _refuse(message: str, hint: str, mark: Any = None) -> InvalidSpec:
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return InvalidSpec([FieldError("", message + where, hint)])


def _flow_depth_exceeds(text: str, limit: int) -> tuple[int, int] | None:
    """Where flow collections (``[``, ``{``) first nest deeper than ``limit``, if they do.

    A linear pre-scan: PyYAML's scanner looks up to 1,024 characters ahead for every open
    bracket (a possible simple key), which costs O(depth x 1,024) before the first event.
    Brackets count only where a collection may start (after an opener, ':', ',', '-', or at
    the start of a value), never inside quotes or comments, so brackets inside a scalar
    (``x[0]``) are not mistaken for nesting.
    """
    depth = 0
    line, column = 0, 0
    previous = "\n"  # the last character that is not a space
    quote: str | None = None
    comment = False
    escaped = False
    spaced = False
    for char in text:
        if char == "\n":
            line, column = line + 1, 0
            comment = spaced = False
            if quote is None:
                previous = "\n"
            continue
        column += 1
        if comment:
            continue
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = None
                previous = char
            continue
        if char in " \t":
            spaced = True
            continue
        after_space, spaced = spaced, False
        if char == "#" and (after_space or previous == "\n"):
            comment = True
            continue
        opens = previous in "\n[{,:-?"
        if char in "'\"" and opens:
            quote = char
        elif char in "[{" and opens:
            depth += 1
            if depth > limit:
                return line, column
        elif char in "]}" and depth:
            depth -= 1
        elif char in "[{":
            previous = "x"  # a bracket inside a scalar: no opener, nor makes the next one
            continue
        previous = char
    return None


def check_yaml_bounds(text: str) -> None:
    """Raise InvalidSpec when ``text`` is over a bound; do not build the document."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_SPEC_BYTES:
        raise _refuse(
            f"the spec is {size} bytes; the limit is {MAX_SPEC_BYTES} bytes",
            "keep large data out of the spec; read it from the code context or storage",
        )
    deep = _flow_depth_exceeds(text, MAX_SPEC_DEPTH)
    if deep is not None:
        raise InvalidSpec(
            [
                FieldError(
                    "",
                    f"the spec nests deeper than {MAX_SPEC_DEPTH} levels "
                    f"(line {deep[0] + 1}, column {deep[1]})",
                    "flatten the structure",
                )
            ]
        )
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (units, depth) it expands to
    stack: list[_Open] = []
    root = _Open(None, units=0)

    def add(units: int, depth: int, mark: Any) -> None:
        parent = stack[-1] if stack else root
        parent.units += units
        parent.depth = max(parent.depth, depth + 1)
        if len(stack) + depth > MAX_SPEC_DEPTH:
            raise _refuse(
                f"the spec nests deeper than {MAX_SPEC_DEPTH} levels",
                "flatten the structure",
                mark,
            )
        if sum(o.units for o in stack) + root.units > MAX_SPEC_EXPANDED_UNITS:
            raise _refuse(
                f"the spec expands (aliases resolved) to more than {MAX_SPEC_EXPANDED_UNITS} "
                "values and characters",
                "use fewer YAML aliases (*name), or write the values once",
                mark,
            )

    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                if len(stack) >= MAX_SPEC_DEPTH:
                    raise _refuse(
                        f"the spec nests deeper than {MAX_SPEC_DEPTH} levels",
                        "flatten the structure",
                        event.start_mark,
                    )
                stack.append(_Open(event.anchor))
            elif isinstance(event, yaml.CollectionEndEvent):
                done = stack.pop()
                if done.anchor is not None:
                    anchors[done.anchor] = (done.units, done.depth)
                add(done.units, done.depth, event.start_mark)
            elif isinstance(event, yaml.ScalarEvent):
                value = event.value
                plain = not event.style  # None (Python parser) or "" (libyaml)
                if plain and len(value) > MAX_INT_DIGITS and _INT.match(value):
                    raise _refuse(
                        f"the integer {value[:20]}... has {len(value)} digits",
                        "integers must fit in 64 bits",
                        event.start_mark,
                    )
                units = 1 + len(value)
                if event.anchor is not None:
                    anchors[event.anchor] = (units, 0)
                add(units, 0, event.start_mark)
            elif isinstance(event, yaml.AliasEvent):
                if any(o.anchor == event.anchor for o in stack):
                    raise _refuse(
                        f"the alias *{event.anchor} refers to a node that contains it",
                        "a spec cannot be recursive",
                        event.start_mark,
                    )
                units, depth = anchors.get(event.anchor or "", (1, 0))
                add(units, depth, event.start_mark)
    except yaml.YAMLError:
        return  # the loader reports the syntax error with its place


def _duplicate_key(node: Any, path: str = "") -> FieldError | None:
    """The first key written twice in one mapping of the composed document, at its field path.

    PyYAML keeps the last of two equal keys silently; a user who wrote ``lr`` twice meant one
    of them, so the spec is refused where it happened."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Any] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name != "<<":
                where = f"{path}.{name}" if path else name
                if name in seen:
                    first = seen[name].start_mark
                    again = key.start_mark
                    return FieldError(
                        where,
                        f"{where} is written twice (lines {first.line + 1} and "
                        f"{again.line + 1}); YAML would keep only the last",
                        "keep one of them",
                    )
                seen[name] = key
            found = _duplicate_key(value, f"{path}.{name}" if path and name else name or path)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _load_unique(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(node)
        if duplicate is not None:
            raise InvalidSpec([duplicate])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of a spec within the bounds and with no key written twice in one
    mapping (InvalidSpec otherwise)."""
    check_yaml_bounds(text)
    try:
        return _load_unique(text)  # a safe loader: plain values only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidSpec(
            [FieldError("", f"not valid YAML at {where}: {problem}", "fix the YAML syntax")]
        ) from None
    except (ValueError, RecursionError) as exc:
        # bounds above make these unreachable; a refusal still beats a 500
        raise InvalidSpec(
            [FieldError("", f"the spec cannot be read: {exc}", "simplify the spec")]
        ) from None
