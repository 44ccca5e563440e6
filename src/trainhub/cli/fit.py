"""Tables that fit the terminal: columns are dropped by priority, never every cell cut to "…".

Rich shrinks a table wider than the terminal by wrapping its cells, and where a cell cannot
wrap (a number, a state) it cuts it to "…"; a 12-column table at 80 columns then shows
nothing readable. :func:`fit_table` first drops the columns that matter least (the last ones
by default, or those a command names) until what is left fits with every word whole, and
says which were left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _header(column: object) -> str:
    header = getattr(column, "header", "")
    return header.plain if isinstance(header, Text) else str(header)


def _minimum_width(table: Table) -> int:
    """The narrowest the table can be with every column at its ``min_width`` (set by
    :func:`_keep_words_whole`), its padding and its rules."""
    columns = table.columns
    if not columns:
        return 0
    _, right, _, left = table.padding  # (top, right, bottom, left)
    pad = (left + right) if table.pad_edge or len(columns) > 1 else 0
    rules = (len(columns) - 1) if table.box else (len(columns) - 1) * table.collapse_padding
    edges = 2 if table.box and table.show_edge else 0
    return sum((c.min_width or 0) + pad for c in columns) + rules + edges


def fit_table(
    table: Table,
    console: Console,
    drop_first: Sequence[str] = (),
    keep: Sequence[str] = (),
) -> list[str]:
    """Drop columns of ``table`` until it fits ``console``'s width with no word cut.

    Columns named in ``drop_first`` go first (in that order), then the others from the last
    to the first; the first column and those in ``keep`` stay. Returns the headers of the
    columns dropped (empty when the table fits as it is).
    """
    width = console.width
    dropped: list[str] = []
    order = [*drop_first]
    order += [_header(c) for c in reversed(table.columns[1:]) if _header(c) not in order]
    order = [name for name in order if name not in keep]
    _keep_words_whole(table)
    for name in order:
        if _minimum_width(table) <= width:
            break
        index = next((i for i, c in enumerate(table.columns) if _header(c) == name), None)
        if index is None or index == 0:
            continue
        del table.columns[index]
        dropped.append(name)
    _share_width(table, width)
    return dropped


def _widest_line(column: object) -> int:
    cells = [c.plain if isinstance(c, Text) else str(c) for c in getattr(column, "cells", [])]
    lines = [_header(column), *(line for c in cells for line in c.splitlines())]
    return max((len(line) for line in lines), default=0)


def _share_width(table: Table, width: int) -> None:
    """Fix each column's width when the table is wider than ``width``: every column gets its
    minimum (its longest word), and what is left goes to the columns that want more, in
    proportion to how much more (Rich's own shrinking can end wider than the terminal)."""
    columns = table.columns
    minimum = _minimum_width(table)
    natural = minimum + sum(max(0, _widest_line(c) - (c.min_width or 0)) for c in columns)
    if natural <= width or minimum > width:
        return
    spare = width - minimum
    wants = [max(0, _widest_line(c) - (c.min_width or 0)) for c in columns]
    total = sum(wants)
    given = [spare * w // total for w in wants] if total else [0] * len(columns)
    for i in sorted(range(len(columns)), key=lambda i: -wants[i])[: spare - sum(given)]:
        given[i] += 1  # the remainder of the rounding, to the columns that want most
    for column, extra in zip(columns, given, strict=True):
        column.width = (column.min_width or 0) + extra


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _keep_words_whole(table: Table) -> None:
    """Rich narrows every column in proportion when a table is too wide; a column as wide as
    its longest word (header included) then wraps between words and cuts none."""
    for column in table.columns:
        cells = [c.plain if isinstance(c, Text) else str(c) for c in column.cells]
        longest = max([_longest_word(_header(column)), *map(_longest_word, cells)])
        if column.no_wrap:
            longest = max([longest, *(len(line) for c in cells for line in c.splitlines())])
        column.min_width = max(column.min_width or 0, longest)


def print_fitted(
    table: Table,
    console: Console,
    drop_first: Sequence[str] = (),
    keep: Sequence[str] = (),
    hint: str = "widen the terminal",
) -> None:
    """Print ``table`` fitted to ``console`` (:func:`fit_table`) and a note of what was left
    out, on stderr's console when ``console`` is stdout's (the note is not data)."""
    dropped = fit_table(table, console, drop_first, keep)
    console.print(table)
    if dropped:
        from trainhub.cli.session import err

        err.print(f"[dim]not shown at {console.width} columns: {', '.join(dropped)} ({hint})[/]")
